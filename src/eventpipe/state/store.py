"""The state store: SQLite under ``data/state.sqlite`` by default, or PostgreSQL
(``state: {type: postgres}``; state/db.py keeps the two apart).

* ``runs``: one row per pipeline run with the exact list of segments it took, and its
  plan: which of them each destination loads (a destination that was stopped has more
  segments to catch up on than the others). A run is written *before* anything is
  loaded, so that a run interrupted by a crash is resumed with the same plan, and so the
  same batch ids: destinations recognise what they already committed and load nothing
  twice. A run stays unfinished while any destination of its plan has not finished it.
* ``segment_status``: segment x destination x table, ``ok`` or ``failed`` with the error
  and the number of attempts (seed 1's DestinationStatus). ``tbl = '*'`` marks a
  destination that finished every table of a segment.
* ``run_tables``: the run history per destination x table: rows loaded, ok or failed
  with the error, so that "what happened to yesterday's data" has an answer (``eventpipe
  status --history``). ``runs.code_versions`` holds each destination's code version
  (processing/batch/version.py) the run's rows were built with.
* ``day_versions``: destination x day (UTC day of the rows' ``_timestamp``) x code
  version: each version some of that day's rows were built with, and for a day rebuilt by
  ``eventpipe reprocess`` the archive files it read, with their sha1 (``inputs``). A day
  with one row, of the current version, whose files are unchanged, is up to date
  (processing/modes/reprocess.py).
* A stream destination records each micro-batch like a segment
  (``queue.dst=<id>/batch-<n>``), one a second: once a later micro-batch is recorded,
  the older ones are folded into one row per table (``queue.dst=<id>/folded``, rows
  summed), and their skipped/filtered/failed counts into one ``destination_runs`` row, so the
  store stays small however long the stream runs.

Every change is one transaction, one writer at a time (SQLite in WAL mode), so a crash
leaves either the old or the new state.

Length (over 500 lines): the schema and every query of the state store, written once
for SQLite and PostgreSQL alike (state/db.py only connects).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, cast

from eventpipe.state.db import Database, PostgresDatabase, SqliteDatabase, Transaction

if TYPE_CHECKING:
    from eventpipe.config import Config

REPROCESS = "reprocess"
"""The trigger of reprocess runs: not resumed by ``process`` (``reprocess`` resumes them)."""
ALL_TABLES = "*"
SENT_TABLE = "*sent*"
"""The table name an http sink's deliveries are recorded under."""
ACKED_TABLE = "*acked*"
"""The table name of segments marked handled without loading (``eventpipe log ack``)."""


def micro_batch(destination: str, epoch: int) -> str:
    """The name a stream destination's micro-batch is recorded under (like a segment)."""
    return f"queue.dst={destination}/batch-{epoch:012d}"


def stream_run(destination: str, epoch: int | str) -> str:
    """The run id of a stream destination's micro-batch (``folded``: of the older ones)."""
    return f"stream-{destination}-{epoch}"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


@dataclass(frozen=True)
class Part:
    """An entry of a run's plan: a whole segment (``<name>``), its lines from ``start``
    on (``<name>@<start>``: a destination that handled the first ones alone, with
    ``eventpipe log step`` or ``log ack``), or ``count`` lines from ``start``
    (``<name>@<start>+<count>``: a step)."""

    segment: str
    start: int = 0
    count: int | None = None

    @classmethod
    def parse(cls, entry: str) -> Part:
        segment, _, lines = entry.partition("@")
        if not lines:
            return cls(segment)
        start, _, count = lines.partition("+")
        return cls(segment, int(start), int(count) if count else None)

    @property
    def whole(self) -> bool:
        return self.start == 0 and self.count is None

    def __str__(self) -> str:
        if self.whole:
            return self.segment
        return f"{self.segment}@{self.start}" + ("" if self.count is None else f"+{self.count}")


@dataclass(frozen=True)
class Run:
    run_id: str
    segments: tuple[str, ...]
    trigger: str
    resumed: bool = False
    plan: dict[str, tuple[str, ...]] | None = None
    """Destination -> the segments it loads in this run (None: a run recorded before
    plans existed; every batch destination loads every segment)."""

    def segments_of(self, destination: str, destinations: Sequence[str]) -> tuple[str, ...]:
        """What ``destination`` loads in this run (``destinations``: the batch ones now)."""
        if self.plan is None:
            return self.segments if destination in destinations else ()
        return self.plan.get(destination, ())

    def plan_for(self, destinations: Sequence[str]) -> dict[str, tuple[str, ...]]:
        """Each of ``destinations`` (the batch ones now) that has segments in this run,
        with them."""
        return {d: segs for d in destinations if (segs := self.segments_of(d, destinations))}


@dataclass(frozen=True)
class TableRun:
    destination: str
    table: str
    status: str
    rows: int
    error: str | None


@dataclass(frozen=True)
class RunRecord:
    """One run of the history (``eventpipe status --history``)."""

    run_id: str
    trigger: str
    started_at: str
    finished_at: str | None
    status: str
    segments: int
    error: str | None
    code_versions: dict[str, str]
    tables: tuple[TableRun, ...]
    events: tuple[tuple[str, int, int, int], ...]
    """Per destination: events skipped (empty table name), failed, and filtered (by its
    namespace or transforms)."""


@dataclass(frozen=True)
class DayVersion:
    """One code version some of a destination's rows of a day were built with."""

    day: str
    code_version: str
    inputs: dict[str, str] | None
    """Archive file -> sha1, for a day rebuilt by a reprocess; None: loaded by runs."""
    run_id: str | None = None
    """The first run that loaded rows of the day with this version (its loads are recorded
    in the destination under its id)."""


@dataclass(frozen=True)
class DestinationSummary:
    last_load: str | None
    rows_loaded: int
    skipped: int
    failed: int
    done_segments: frozenset[str]
    filtered: int = 0
    """Events the destination's namespace or transforms dropped."""


@dataclass(frozen=True)
class TableProgress:
    table: str
    batches_ok: int
    """Segments (and stream micro-batches) recorded loaded."""
    rows: int
    batches_failed: int
    last_update: str
    last_error: str | None


class StateStore:
    def __init__(self, where: Path | Database) -> None:
        """The store in the SQLite file ``where``, or in the database ``where``."""
        self.db: Database = SqliteDatabase(where) if isinstance(where, Path) else where

    def _db(self) -> AbstractContextManager[Transaction]:
        return cast("AbstractContextManager[Transaction]", self.db.transaction())

    def unfinished_runs(self) -> list[Run]:
        """The runs that did not finish (killed, or a destination stopped by an error),
        oldest first: each is completed with its own plan, by the destinations that have
        not finished it, before they take new segments."""
        with self._db() as db:
            rows = db.execute(
                "SELECT run_id, segments, trigger, plan FROM runs "
                "WHERE status IN ('running', 'interrupted') AND trigger != ? "
                "ORDER BY started_at, rowid",
                (REPROCESS,),
            ).fetchall()
        return [
            Run(run_id, tuple(json.loads(segments)), trigger, resumed=True,
                plan=None if plan is None else {d: tuple(s) for d, s in json.loads(plan).items()})
            for run_id, segments, trigger, plan in rows
        ]  # fmt: skip

    def unfinished_run(self) -> Run | None:
        """The oldest unfinished run, if any."""
        runs = self.unfinished_runs()
        return runs[0] if runs else None

    def begin_run(
        self,
        segments: Sequence[str],
        trigger: str,
        plan: Mapping[str, Sequence[str]] | None = None,
        code_versions: Mapping[str, str] | None = None,
    ) -> Run:
        """Record a new run of ``segments`` (``plan``: each destination's; default: every
        destination loads all of them; ``code_versions``: each destination's)."""
        fixed = None if plan is None else {d: tuple(s) for d, s in plan.items()}
        run = Run(f"run-{uuid.uuid4().hex[:12]}", tuple(segments), trigger, plan=fixed)
        with self._db() as db:
            _insert_run(db, run, code_versions or {})
        return run

    def begin_reprocess(self, run_id: str, entry: str, destination: str, version: str) -> None:
        """Record the reprocess run ``run_id`` of one destination's days (``entry``), or
        mark it running again: an interrupted one is resumed under its id (found by its
        entry, :meth:`unfinished_reprocesses`)."""
        run = Run(run_id, (entry,), REPROCESS, plan={destination: (entry,)})
        with self._db() as db:
            found = db.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            if found is None:
                _insert_run(db, run, {destination: version})
            else:
                db.execute("UPDATE runs SET status = 'running' WHERE run_id = ?", (run_id,))

    def unfinished_reprocesses(self, prefix: str) -> list[tuple[str, str]]:
        """(run id, entry) of the reprocess runs not done whose entry starts with
        ``prefix``, oldest first."""
        with self._db() as db:
            rows = db.execute(
                "SELECT run_id, segments FROM runs WHERE trigger = ? AND status != 'done' "
                "AND status != 'abandoned' ORDER BY started_at, rowid",
                (REPROCESS,),
            ).fetchall()
        found = [(run_id, json.loads(segments)[0]) for run_id, segments in rows]
        return [(run_id, entry) for run_id, entry in found if entry.startswith(prefix)]

    def abandon_run(self, run_id: str, reason: str) -> None:
        """A reprocess run that will not be finished (what it would rebuild changed)."""
        with self._db() as db:
            db.execute(
                "UPDATE runs SET status = 'abandoned', finished_at = ?, error = ? WHERE run_id = ?",
                (_now(), reason, run_id),
            )
            db.execute("DELETE FROM segment_status WHERE run_id = ?", (run_id,))

    def loaded_tables(self, segment: str, destination: str) -> list[str]:
        """The tables ``destination`` recorded ok for ``segment`` (a run's entry)."""
        with self._db() as db:
            rows = db.execute(
                "SELECT tbl FROM segment_status WHERE segment = ? AND destination = ? "
                "AND status = 'ok' AND tbl NOT LIKE '*%' ORDER BY tbl",
                (segment, destination),
            ).fetchall()
        return [table for (table,) in rows]

    def destination_tables(self, destination: str) -> list[str]:
        """Every table ``destination`` ever loaded (by the records of its loads)."""
        with self._db() as db:
            rows = db.execute(
                "SELECT tbl FROM segment_status WHERE destination = ? "
                "UNION SELECT tbl FROM run_tables WHERE destination = ? ORDER BY 1",
                (destination, destination),
            ).fetchall()
        return [table for (table,) in rows if not table.startswith("*")]

    def record_days(
        self, destination: str, days: Sequence[str], code_version: str, run_id: str
    ) -> None:
        """Rows of ``days`` were loaded into ``destination`` built with ``code_version``."""
        with self._db() as db:
            db.executemany(
                "INSERT INTO day_versions (destination, day, code_version, run_id, updated_at) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                [(destination, day, code_version, run_id, _now()) for day in days],
            )

    def day_versions(self, destination: str, first: str, last: str) -> dict[str, list[DayVersion]]:
        """The recorded versions of ``destination``'s days ``first``..``last``, by day."""
        with self._db() as db:
            rows = db.execute(
                "SELECT day, code_version, inputs, run_id FROM day_versions "
                "WHERE destination = ? AND day BETWEEN ? AND ? ORDER BY day, code_version",
                (destination, first, last),
            ).fetchall()
        found: dict[str, list[DayVersion]] = {}
        for day, version, inputs, run_id in rows:
            recorded = None if inputs is None else json.loads(inputs)
            found.setdefault(day, []).append(DayVersion(day, version, recorded, run_id))
        return found

    def rebuilt_days(
        self,
        destination: str,
        days: Sequence[str],
        code_version: str,
        inputs: Mapping[str, str],
        run_id: str,
    ) -> None:
        """A reprocess replaced ``destination``'s rows of ``days``: their only version now,
        and the run is done (its per-table progress records are dropped)."""
        recorded = json.dumps(dict(inputs), sort_keys=True)
        with self._db() as db:
            db.executemany(
                "DELETE FROM day_versions WHERE destination = ? AND day = ?",
                [(destination, day) for day in days],
            )
            db.executemany(
                "INSERT INTO day_versions VALUES (?, ?, ?, ?, ?, ?)",
                [(destination, day, code_version, recorded, run_id, _now()) for day in days],
            )
            db.execute(
                "DELETE FROM segment_status WHERE run_id = ? AND destination = ?",
                (run_id, destination),
            )
            db.execute(
                "UPDATE runs SET status = 'done', finished_at = ?, error = NULL WHERE run_id = ?",
                (_now(), run_id),
            )

    def history(self, limit: int = 20) -> list[RunRecord]:
        """The last ``limit`` runs, newest first, with what each loaded."""
        with self._db() as db:
            runs = db.execute(
                "SELECT run_id, trigger, started_at, finished_at, status, segments, error, "
                "code_versions FROM runs ORDER BY started_at DESC, rowid DESC LIMIT ?",
                (limit,),
            ).fetchall()
            ids = [r[0] for r in runs]
            if not ids:
                return []
            marks = ",".join("?" * len(ids))
            tables = db.execute(
                "SELECT run_id, destination, tbl, status, rows, error FROM run_tables "
                f"WHERE run_id IN ({marks}) ORDER BY destination, tbl",
                ids,
            ).fetchall()
            counts = db.execute(
                "SELECT run_id, destination, skipped, failed, filtered FROM destination_runs "
                f"WHERE run_id IN ({marks}) ORDER BY destination",
                ids,
            ).fetchall()
        return [
            RunRecord(
                run_id=run_id, trigger=trigger, started_at=started, finished_at=finished,
                status=status, segments=len(json.loads(segments)), error=error,
                code_versions=json.loads(versions or "{}"),
                tables=tuple(TableRun(*t[1:]) for t in tables if t[0] == run_id),
                events=tuple((c[1], c[2], c[3], c[4]) for c in counts if c[0] == run_id),
            )
            for run_id, trigger, started, finished, status, segments, error, versions in runs
        ]  # fmt: skip

    def finish_run(self, run_id: str, status: str, error: str | None = None) -> None:
        with self._db() as db:
            db.execute(
                "UPDATE runs SET status = ?, finished_at = ?, error = ? WHERE run_id = ?",
                (status, _now(), error, run_id),
            )

    def record(
        self,
        segments: Sequence[str],
        destination: str,
        table: str,
        *,
        ok: bool,
        rows: int = 0,
        error: str | None = None,
        run_id: str | None = None,
    ) -> None:
        """Record the outcome of one destination x table for every segment of a batch.
        The batch's ``rows`` are counted once, on its first segment (a batch loads its
        segments together: rows per segment are not known), so that sums are right."""
        with self._db() as db:
            _record(db, segments, destination, table, ok=ok, rows=rows, error=error,
                    run_id=run_id)  # fmt: skip

    def forget(self, segments: Sequence[str], destination: str) -> None:
        """Remove the records of ``segments`` for ``destination`` (entries that were not
        segments of the log: the parts of an isolated run)."""
        with self._db() as db:
            for segment in segments:
                db.execute(
                    "DELETE FROM segment_status WHERE segment = ? AND destination = ?",
                    (segment, destination),
                )

    def table_ok(self, segments: Sequence[str], destination: str, table: str) -> bool:
        """Whether this destination x table is recorded ok for every one of ``segments``."""
        if not segments:
            return True
        with self._db() as db:
            (count,) = db.execute(
                "SELECT count(*) FROM segment_status WHERE destination = ? AND tbl = ? "
                f"AND status = 'ok' AND segment IN ({','.join('?' * len(segments))})",
                (destination, table, *segments),
            ).fetchone()
        return int(count) == len(set(segments))

    def cursors(self, destination: str) -> dict[str, int]:
        """Per segment that ``destination`` handled in part (lines one by one: ``log
        step``, ``log ack``), the first line it has not handled."""
        with self._db() as db:
            return dict(
                db.execute(
                    "SELECT segment, next_line FROM cursors WHERE destination = ?",
                    (destination,),
                ).fetchall()
            )

    def advance(
        self, destination: str, segment: str, next_line: int, *, done: bool, run_id: str
    ) -> None:
        """``destination`` handled ``segment`` up to ``next_line`` (excluded); ``done``:
        to its end, so the segment is recorded finished. Idempotent."""
        with self._db() as db:
            if done:
                db.execute("DELETE FROM cursors WHERE destination = ? AND segment = ?",
                           (destination, segment))  # fmt: skip
                _record(db, [segment], destination, ALL_TABLES, ok=True, run_id=run_id)
                return
            db.execute(
                "INSERT INTO cursors VALUES (?, ?, ?, ?) ON CONFLICT (destination, segment) "
                f"DO UPDATE SET next_line = {_greater('cursors.next_line', 'excluded.next_line')}, "
                "updated_at = excluded.updated_at",
                (destination, segment, next_line, _now()),
            )

    def acknowledge(self, destination: str, segments: Sequence[str]) -> None:
        """Mark ``segments`` handled by ``destination`` without loading them."""
        with self._db() as db:
            for segment in segments:
                db.execute("DELETE FROM cursors WHERE destination = ? AND segment = ?",
                           (destination, segment))  # fmt: skip
            _record(db, segments, destination, ACKED_TABLE, ok=True, run_id="ack")
            _record(db, segments, destination, ALL_TABLES, ok=True, run_id="ack")

    def done_by(self, destination: str, segments: Sequence[str]) -> set[str]:
        """Those of ``segments`` that ``destination`` finished (``tbl = '*'`` ok)."""
        with self._db() as db:
            return {
                segment
                for (segment,) in db.execute(
                    "SELECT segment FROM segment_status WHERE destination = ? AND tbl = ? "
                    "AND status = 'ok'",
                    (destination, ALL_TABLES),
                )
            } & set(segments)

    def segments_done(self, segments: Sequence[str], destinations: Sequence[str]) -> list[str]:
        """Those of ``segments`` that every one of ``destinations`` finished."""
        done = set(segments)
        for destination in destinations:
            done &= self.done_by(destination, segments)
        return [s for s in segments if s in done]

    def record_destination_run(
        self, run_id: str, destination: str, *, skipped: int, failed: int, filtered: int = 0
    ) -> None:
        with self._db() as db:
            db.execute(
                "INSERT INTO destination_runs (run_id, destination, skipped, failed, "
                "finished_at, filtered) VALUES (?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (run_id, destination) DO UPDATE SET skipped = excluded.skipped, "
                "failed = excluded.failed, finished_at = excluded.finished_at, "
                "filtered = excluded.filtered",
                (run_id, destination, skipped, failed, _now(), filtered),
            )

    def fold_stream(self, destination: str, epoch: int) -> None:
        """Fold the records of the stream destination's micro-batches before ``epoch``
        into its ``folded`` rows (the micro-batch under way keeps its own)."""
        prefix = micro_batch(destination, 0).removesuffix(f"{0:012d}")  # batch-<n> of any n
        folded = f"queue.dst={destination}/folded"
        folded_run = stream_run(destination, "folded")
        with self._db() as db:
            db.execute(
                "INSERT INTO segment_status (segment, destination, tbl, status, rows, run_id, "
                "updated_at) SELECT ?, destination, tbl, 'ok', sum(rows), ?, "
                "max(updated_at) FROM segment_status WHERE destination = ? AND status = 'ok' "
                "AND tbl != ? AND segment >= ? AND segment < ? GROUP BY destination, tbl "
                "ON CONFLICT (segment, destination, tbl) DO UPDATE SET "
                "rows = segment_status.rows + excluded.rows, updated_at = "
                f"{_greater('segment_status.updated_at', 'excluded.updated_at')}",
                (folded, folded_run, destination, ALL_TABLES, prefix,
                 micro_batch(destination, epoch)),
            )  # fmt: skip
            db.execute(
                "DELETE FROM segment_status WHERE destination = ? AND status = 'ok' "
                "AND segment >= ? AND segment < ?",
                (destination, prefix, micro_batch(destination, epoch)),
            )
            runs = stream_run(destination, "")
            older = [
                run_id
                for (run_id,) in db.execute(
                    "SELECT run_id FROM destination_runs WHERE destination = ?", (destination,)
                )
                if run_id.startswith(runs)
                and run_id.removeprefix(runs).isdigit()
                and int(run_id.removeprefix(runs)) < epoch
            ]
            if not older:
                return
            marks = ",".join("?" * len(older))
            db.execute(
                "INSERT INTO destination_runs (run_id, destination, skipped, failed, "
                "finished_at, filtered) SELECT ?, destination, sum(skipped), sum(failed), "
                "max(finished_at), sum(filtered) FROM destination_runs WHERE destination = ? "
                f"AND run_id IN ({marks}) GROUP BY destination "
                "ON CONFLICT (run_id, destination) DO UPDATE SET "
                "skipped = destination_runs.skipped + excluded.skipped, "
                "failed = destination_runs.failed + excluded.failed, "
                "filtered = destination_runs.filtered + excluded.filtered, finished_at = "
                f"{_greater('destination_runs.finished_at', 'excluded.finished_at')}",
                (folded_run, destination, *older),
            )
            db.execute(
                f"DELETE FROM destination_runs WHERE destination = ? AND run_id IN ({marks})",
                (destination, *older),
            )

    def summary(self, destination: str) -> DestinationSummary:
        """What ``eventpipe status`` shows for one destination."""
        with self._db() as db:
            last, rows = db.execute(
                "SELECT max(updated_at), coalesce(sum(rows), 0) FROM segment_status "
                "WHERE destination = ? AND tbl != ? AND status = 'ok'",
                (destination, ALL_TABLES),
            ).fetchone()
            skipped, failed, filtered = db.execute(
                "SELECT coalesce(sum(skipped), 0), coalesce(sum(failed), 0), "
                "coalesce(sum(filtered), 0) "
                "FROM destination_runs WHERE destination = ?",
                (destination,),
            ).fetchone()
            done = {
                segment
                for (segment,) in db.execute(
                    "SELECT segment FROM segment_status WHERE destination = ? AND tbl = ? "
                    "AND status = 'ok'",
                    (destination, ALL_TABLES),
                )
            }
        return DestinationSummary(
            last, int(rows), int(skipped), int(failed), frozenset(done), int(filtered)
        )

    def tables(self, destination: str) -> list[TableProgress]:
        """Per table of one destination: what its records add up to."""
        with self._db() as db:
            rows = db.execute(
                "SELECT tbl, count(*) FILTER (WHERE status = 'ok'), "
                "coalesce(sum(rows) FILTER (WHERE status = 'ok'), 0), "
                "count(*) FILTER (WHERE status = 'failed'), max(updated_at), "
                "max(error) FILTER (WHERE status = 'failed') "
                "FROM segment_status WHERE destination = ? AND tbl != ? GROUP BY tbl "
                "ORDER BY tbl",
                (destination, ALL_TABLES),
            ).fetchall()
        return [
            TableProgress(table, int(ok), int(rows), int(failed), last, error)
            for table, ok, rows, failed, last, error in rows
        ]

    def failing_tables(self, destination: str) -> list[tuple[str, str]]:
        """The tables of ``destination`` whose latest run failed them (a table the
        database refused to create or change), with the reason, by name."""
        with self._db() as db:
            rows = db.execute(
                "SELECT tbl, coalesce(error, '') FROM run_tables AS r WHERE destination = ? "
                "AND tbl != ? AND status = 'failed' AND updated_at = (SELECT max(updated_at) "
                "FROM run_tables WHERE destination = r.destination AND tbl = r.tbl) "
                "ORDER BY tbl",
                (destination, ALL_TABLES),
            ).fetchall()
        return [(str(table), str(error)) for table, error in rows]

    def statuses(self) -> list[tuple[str, str, str, str, int, str | None, int]]:
        with self._db() as db:
            return list(
                db.execute(
                    "SELECT segment, destination, tbl, status, rows, error, attempts "
                    "FROM segment_status ORDER BY segment, destination, tbl"
                )
            )


def open_state(config: Config) -> StateStore:
    """The state store ``config`` names (``state:``): SQLite under ``data_dir`` by default."""
    if config.state.type == "postgres":
        assert config.state.dsn is not None  # the config checked it
        return StateStore(PostgresDatabase(config.state.dsn, config.state.db_schema))
    return StateStore(config.layout.state)


def _greater(a: str, b: str) -> str:
    """SQL for the greater of two values (SQLite's two-argument ``max``, PostgreSQL's
    ``greatest``: neither has the other's)."""
    return f"CASE WHEN {b} > {a} THEN {b} ELSE {a} END"


def _insert_run(db: Transaction, run: Run, code_versions: Mapping[str, str]) -> None:
    db.execute(
        "INSERT INTO runs (run_id, trigger, started_at, status, segments, plan, "
        "code_versions) VALUES (?, ?, ?, 'running', ?, ?, ?)",
        (run.run_id, run.trigger, _now(), json.dumps(list(run.segments)),
         None if run.plan is None else json.dumps(run.plan), json.dumps(dict(code_versions))),
    )  # fmt: skip


def _record(
    db: Transaction,
    segments: Sequence[str],
    destination: str,
    table: str,
    *,
    ok: bool,
    rows: int = 0,
    error: str | None = None,
    run_id: str | None = None,
) -> None:
    for index, segment in enumerate(segments):
        db.execute(
            "INSERT INTO segment_status (segment, destination, tbl, status, rows, "
            "error, run_id, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (segment, destination, tbl) DO UPDATE SET "
            "status = excluded.status, rows = excluded.rows, error = excluded.error, "
            "attempts = segment_status.attempts + 1, run_id = excluded.run_id, "
            "updated_at = excluded.updated_at",
            (segment, destination, table, "ok" if ok else "failed",
             rows if index == 0 else 0, error, run_id, _now()),
        )  # fmt: skip
    if run_id is not None and segments and table != ACKED_TABLE and (not ok or table != ALL_TABLES):
        # The run history: tables, and a destination that failed as a whole ('*'). Runs
        # of the runs table only (a stream's micro-batches have their own records,
        # folded); a resumed run's retry replaces its earlier attempt.
        db.execute(
            "INSERT INTO run_tables SELECT ?, ?, ?, ?, ?, ?, ? "
            "WHERE EXISTS (SELECT 1 FROM runs WHERE run_id = ?) "
            "ON CONFLICT (run_id, destination, tbl) DO UPDATE SET status = excluded.status, "
            "rows = excluded.rows, error = excluded.error, updated_at = excluded.updated_at",
            (run_id, destination, table, "ok" if ok else "failed", rows, error, _now(), run_id),
        )
