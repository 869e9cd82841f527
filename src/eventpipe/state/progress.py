"""Where each destination stands in the log: segment x destination x table statuses,
cursors inside a segment (``log step``), acknowledged segments, and a stream's
micro-batches folded as they age."""

from __future__ import annotations

from collections.abc import Sequence

from eventpipe.state.db import Store, Transaction
from eventpipe.state.records import (
    ACKED_TABLE,
    ALL_TABLES,
    ContractCount,
    SchemaChange,
    micro_batch,
    now_text,
    stream_run,
)


class SegmentProgress(Store):
    """Each destination's progress through the log."""

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
                (destination, segment, next_line, now_text()),
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
        self,
        run_id: str,
        destination: str,
        *,
        skipped: int,
        failed: int,
        filtered: int = 0,
        contracts: Sequence[ContractCount] = (),
    ) -> None:
        """A destination's counts of one run (a resumed run's replace the earlier try's),
        with what its contracts held back or found (each replacing its own count)."""
        with self._db() as db:
            if contracts:
                db.executemany(
                    "INSERT INTO contract_counts (run_id, destination, kind, subject, rule, "
                    "events) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (run_id, destination, kind, "
                    "subject, rule) DO UPDATE SET events = excluded.events",
                    [(run_id, destination, c.kind, c.subject, c.rule, c.events)
                     for c in contracts],
                )  # fmt: skip
            db.execute(
                "INSERT INTO destination_runs (run_id, destination, skipped, failed, "
                "finished_at, filtered) VALUES (?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (run_id, destination) DO UPDATE SET skipped = excluded.skipped, "
                "failed = excluded.failed, finished_at = excluded.finished_at, "
                "filtered = excluded.filtered",
                (run_id, destination, skipped, failed, now_text(), filtered),
            )

    def record_schema_changes(self, changes: Sequence[SchemaChange]) -> None:
        """Changes made to destinations' tables (each kept once: the first run that made
        it; a resumed run's repeat changes nothing)."""
        if not changes:
            return
        with self._db() as db:
            db.executemany(
                "INSERT INTO schema_changes (destination, tbl, change, col, data_type, run_id, "
                "at) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (destination, tbl, change, col) "
                "DO NOTHING",
                [(c.destination, c.table, c.change, c.column, c.data_type, c.run_id, c.at)
                 for c in changes],
            )  # fmt: skip

    def record_read(self, run_id: str, destination: str, events: int) -> None:
        """The events a stream micro-batch read for ``destination`` (its log lines): what
        the console's ledger holds its rows, failures and skips against."""
        with self._db() as db:
            db.execute(
                "UPDATE destination_runs SET events = ? WHERE run_id = ? AND destination = ?",
                (events, run_id, destination),
            )

    def fold_stream(self, destination: str, epoch: int) -> None:
        """Fold the records of the stream destination's micro-batches before ``epoch``
        into its ``folded-<day>`` rows, one per UTC day they were recorded on (the
        micro-batch under way keeps its own): the ledger counts a stream by day."""
        prefix = micro_batch(destination, 0).removesuffix(f"{0:012d}")  # batch-<n> of any n
        folded = f"queue.dst={destination}/folded-"
        folded_run = stream_run(destination, "folded-")
        day = "substr(updated_at, 1, 10)"
        with self._db() as db:
            db.execute(
                "INSERT INTO segment_status (segment, destination, tbl, status, rows, run_id, "
                f"updated_at) SELECT ? || {day}, destination, tbl, 'ok', sum(rows), "
                f"? || {day}, max(updated_at) FROM segment_status WHERE destination = ? "
                "AND status = 'ok' AND tbl != ? AND segment >= ? AND segment < ? "
                f"GROUP BY destination, tbl, {day} "
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
            # Contracts' counts first: their day is their run's, read before it is folded.
            db.execute(
                "INSERT INTO contract_counts (run_id, destination, kind, subject, rule, events) "
                "SELECT ? || substr(r.finished_at, 1, 10), c.destination, c.kind, c.subject, "
                "c.rule, sum(c.events) FROM contract_counts c JOIN destination_runs r ON "
                "r.run_id = c.run_id AND r.destination = c.destination "
                f"WHERE c.destination = ? AND c.run_id IN ({marks}) "
                "GROUP BY c.destination, c.kind, c.subject, c.rule, substr(r.finished_at, 1, 10) "
                "ON CONFLICT (run_id, destination, kind, subject, rule) DO UPDATE SET "
                "events = contract_counts.events + excluded.events",
                (folded_run, destination, *older),
            )
            db.execute(
                f"DELETE FROM contract_counts WHERE destination = ? AND run_id IN ({marks})",
                (destination, *older),
            )
            db.execute(
                "INSERT INTO destination_runs (run_id, destination, skipped, failed, "
                "finished_at, filtered, events) SELECT ? || substr(finished_at, 1, 10), "
                "destination, sum(skipped), sum(failed), max(finished_at), sum(filtered), "
                "CASE WHEN count(events) = count(*) THEN sum(events) END FROM "
                f"destination_runs WHERE destination = ? AND run_id IN ({marks}) "
                "GROUP BY destination, substr(finished_at, 1, 10) "
                "ON CONFLICT (run_id, destination) DO UPDATE SET "
                "skipped = destination_runs.skipped + excluded.skipped, "
                "failed = destination_runs.failed + excluded.failed, "
                "filtered = destination_runs.filtered + excluded.filtered, "
                "events = destination_runs.events + excluded.events, finished_at = "
                f"{_greater('destination_runs.finished_at', 'excluded.finished_at')}",
                (folded_run, destination, *older),
            )
            db.execute(
                f"DELETE FROM destination_runs WHERE destination = ? AND run_id IN ({marks})",
                (destination, *older),
            )


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
             rows if index == 0 else 0, error, run_id, now_text()),
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
            (run_id, destination, table, "ok" if ok else "failed", rows, error, now_text(), run_id),
        )


def _greater(a: str, b: str) -> str:
    """SQL for the greater of two values (SQLite's two-argument ``max``, PostgreSQL's
    ``greatest``: neither has the other's)."""
    return f"CASE WHEN {b} > {a} THEN {b} ELSE {a} END"
