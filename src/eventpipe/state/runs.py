"""The runs: each written before anything of it loads (its segments and plan), resumed
with the same plan until every destination of it finished, or abandoned."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence

from eventpipe.state.db import Store, Transaction
from eventpipe.state.records import (
    REPROCESS,
    Run,
    now_text,
)


class RunRecords(Store):
    """The runs and their plans."""

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
                (now_text(), reason, run_id),
            )
            db.execute("DELETE FROM segment_status WHERE run_id = ?", (run_id,))

    def finish_run(self, run_id: str, status: str, error: str | None = None) -> None:
        with self._db() as db:
            db.execute(
                "UPDATE runs SET status = ?, finished_at = ?, error = ? WHERE run_id = ?",
                (status, now_text(), error, run_id),
            )


def _insert_run(db: Transaction, run: Run, code_versions: Mapping[str, str]) -> None:
    db.execute(
        "INSERT INTO runs (run_id, trigger, started_at, status, segments, plan, "
        "code_versions) VALUES (?, ?, ?, 'running', ?, ?, ?)",
        (run.run_id, run.trigger, now_text(), json.dumps(list(run.segments)),
         None if run.plan is None else json.dumps(run.plan), json.dumps(dict(code_versions))),
    )  # fmt: skip
