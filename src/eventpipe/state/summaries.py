"""What ``eventpipe status`` reads: the run history, each destination's summary and
tables, failing tables, every status row."""

from __future__ import annotations

import json

from eventpipe.state.db import Store
from eventpipe.state.records import (
    ALL_TABLES,
    ContractCount,
    DestinationSummary,
    RunRecord,
    SchemaChange,
    StreamCounts,
    TableProgress,
    TableRun,
)


class Summaries(Store):
    """What ``eventpipe status`` reads."""

    def history(
        self, limit: int = 20, since: str | None = None, until: str | None = None
    ) -> list[RunRecord]:
        """The last ``limit`` runs, newest first, with what each loaded (``since`` and
        ``until``: of those started in ``[since, until)``, ISO 8601 UTC text)."""
        with self._db() as db:
            runs = db.execute(
                "SELECT run_id, trigger, started_at, finished_at, status, segments, error, "
                "code_versions FROM runs WHERE started_at >= ? AND started_at < ? "
                "ORDER BY started_at DESC, rowid DESC LIMIT ?",
                (since or "", until or "\uffff", limit),
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
            contracts = db.execute(
                "SELECT run_id, kind, subject, rule, events, destination FROM contract_counts "
                f"WHERE run_id IN ({marks}) ORDER BY destination, kind, subject, rule",
                ids,
            ).fetchall()
        return [
            RunRecord(
                run_id=run_id, trigger=trigger, started_at=started, finished_at=finished,
                status=status, segments=len(json.loads(segments)), error=error,
                code_versions=json.loads(versions or "{}"),
                tables=tuple(TableRun(*t[1:]) for t in tables if t[0] == run_id),
                events=tuple((c[1], c[2], c[3], c[4]) for c in counts if c[0] == run_id),
                contracts=tuple(ContractCount(*c[1:]) for c in contracts if c[0] == run_id),
            )
            for run_id, trigger, started, finished, status, segments, error, versions in runs
        ]  # fmt: skip

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

    def stream_counts(
        self, destination: str, since: str | None = None, until: str | None = None
    ) -> StreamCounts:
        """What a stream destination's micro-batches recorded in ``[since, until)`` (ISO
        8601 UTC text; the older micro-batches are kept a row per UTC day, so a range
        counts them by the day they were recorded on)."""
        low, high = since or "", until or "\uffff"
        with self._db() as db:
            last, rows = db.execute(
                "SELECT max(updated_at), coalesce(sum(rows), 0) FROM segment_status "
                "WHERE destination = ? AND tbl != ? AND status = 'ok' "
                "AND updated_at >= ? AND updated_at < ?",
                (destination, ALL_TABLES, low, high),
            ).fetchone()
            runs, recorded, events, skipped, failed, filtered = db.execute(
                "SELECT count(*), count(events), coalesce(sum(events), 0), "
                "coalesce(sum(skipped), 0), coalesce(sum(failed), 0), "
                "coalesce(sum(filtered), 0) FROM destination_runs WHERE destination = ? "
                "AND finished_at >= ? AND finished_at < ?",
                (destination, low, high),
            ).fetchone()
            contracts = db.execute(
                "SELECT c.kind, c.subject, c.rule, sum(c.events) FROM contract_counts c "
                "JOIN destination_runs r ON r.run_id = c.run_id AND r.destination = "
                "c.destination WHERE c.destination = ? AND r.finished_at >= ? AND "
                "r.finished_at < ? GROUP BY c.kind, c.subject, c.rule",
                (destination, low, high),
            ).fetchall()
        return StreamCounts(
            last_load=last, rows_loaded=int(rows), skipped=int(skipped), failed=int(failed),
            filtered=int(filtered), events_read=int(events) if runs == recorded else None,
            contracts=tuple(ContractCount(k, s, r, int(n), destination)
                            for k, s, r, n in contracts),
        )  # fmt: skip

    def contract_counts(self, destination: str) -> list[ContractCount]:
        """What the destination's contracts found or held back, over every run kept."""
        with self._db() as db:
            rows = db.execute(
                "SELECT kind, subject, rule, sum(events) FROM contract_counts "
                "WHERE destination = ? GROUP BY kind, subject, rule ORDER BY kind, subject, rule",
                (destination,),
            ).fetchall()
        return [ContractCount(k, s, r, int(n), destination) for k, s, r, n in rows]

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

    def schema_changes(self, destination: str, limit: int = 500) -> list[SchemaChange]:
        """The changes eventpipe made to ``destination``'s tables, newest first."""
        with self._db() as db:
            rows = db.execute(
                "SELECT destination, tbl, change, col, data_type, run_id, at FROM "
                "schema_changes WHERE destination = ? ORDER BY at DESC, tbl, change, col "
                "LIMIT ?",
                (destination, limit),
            ).fetchall()
        return [SchemaChange(*row) for row in rows]

    def recent_loads(self, destination: str, limit: int = 20) -> list[tuple[str, str, int, str]]:
        """(run, table, rows, when) of ``destination``'s last loads, newest first."""
        with self._db() as db:
            rows = db.execute(
                "SELECT run_id, tbl, rows, updated_at FROM run_tables WHERE destination = ? "
                "AND status = 'ok' AND tbl != ? ORDER BY updated_at DESC, tbl LIMIT ?",
                (destination, ALL_TABLES, limit),
            ).fetchall()
        return [(run, table, int(n), at) for run, table, n, at in rows]

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

    def run_segments(self, run_id: str) -> dict[str, tuple[str, ...]] | None:
        """Each destination's segments in run ``run_id`` (None: no such run); a run
        without a plan gave every destination all of its segments (an empty key)."""
        with self._db() as db:
            row = db.execute("SELECT segments, plan FROM runs WHERE run_id = ?",
                             (run_id,)).fetchone()  # fmt: skip
        if row is None:
            return None
        segments, plan = row
        if plan is None:
            return {"": tuple(json.loads(segments))}
        return {d: tuple(s) for d, s in json.loads(plan).items()}

    def segment_statuses(self, segment: str) -> list[tuple[str, str, str, str | None, str | None]]:
        """(destination, table, status, run id, error) of every record of ``segment``."""
        with self._db() as db:
            return [
                (str(d), str(t), str(s), r, e)
                for d, t, s, r, e in db.execute(
                    "SELECT destination, tbl, status, run_id, error FROM segment_status "
                    "WHERE segment = ? ORDER BY destination, tbl",
                    (segment,),
                )
            ]

    def statuses(self) -> list[tuple[str, str, str, str, int, str | None, int]]:
        with self._db() as db:
            return list(
                db.execute(
                    "SELECT segment, destination, tbl, status, rows, error, attempts "
                    "FROM segment_status ORDER BY segment, destination, tbl"
                )
            )
