"""Closing a run (job.close_run) on a real state store (SQLite): a run is done only when
every destination of its plan finished it, and a part of a segment moves its
destination's cursor before the run is marked."""

from __future__ import annotations

from pathlib import Path

from eventpipe.config import Config
from eventpipe.processing.batch.job import close_run
from eventpipe.state.store import ALL_TABLES, StateStore

SEGMENT = "incoming.tok=web-2026-11-21T10-00-00.000.log"


def _store(tmp_path: Path) -> tuple[Config, StateStore]:
    config = Config(data_dir=tmp_path / "data")
    config.layout.incoming.mkdir(parents=True)
    (config.layout.incoming / SEGMENT).write_bytes(b"{}\n" * 10)
    return config, StateStore(config.layout.state)


def test_a_run_is_done_when_every_destination_finished_and_its_tmp_goes(tmp_path: Path) -> None:
    config, state = _store(tmp_path)
    plan = {"a": (SEGMENT,), "b": (SEGMENT,)}
    run = state.begin_run([SEGMENT], "once", plan)
    (config.layout.tmp / run.run_id).mkdir(parents=True)
    state.record([SEGMENT], "a", ALL_TABLES, ok=True, run_id=run.run_id)
    close_run(config.layout, state, run, plan, {"b": "postgres is down"})
    [record] = state.history()
    assert (record.status, record.error) == ("interrupted", "b: postgres is down")
    assert state.unfinished_run() is not None  # resumed by the next run
    assert (config.layout.tmp / run.run_id).exists()  # what it staged is kept for that
    state.record([SEGMENT], "b", ALL_TABLES, ok=True, run_id=run.run_id)
    close_run(config.layout, state, run, plan, {})
    [record] = state.history()
    assert record.status == "done"
    assert state.unfinished_run() is None
    assert not (config.layout.tmp / run.run_id).exists()


def test_a_part_of_a_segment_moves_the_cursor_before_the_run_is_marked(tmp_path: Path) -> None:
    config, state = _store(tmp_path)
    part = f"{SEGMENT}@0+4"
    plan = {"a": (part,)}
    run = state.begin_run([part], "step", plan)
    state.record([part], "a", ALL_TABLES, ok=True, run_id=run.run_id)
    close_run(config.layout, state, run, plan, {})
    assert state.cursors("a") == {SEGMENT: 4}
    assert state.done_by("a", [SEGMENT]) == set()  # 4 of its 10 lines
    # Closed again (a crash after the cursor moved): the same cursor, nothing twice.
    close_run(config.layout, state, run, plan, {})
    assert state.cursors("a") == {SEGMENT: 4}
    rest = f"{SEGMENT}@4"
    run = state.begin_run([rest], "step", {"a": (rest,)})
    state.record([rest], "a", ALL_TABLES, ok=True, run_id=run.run_id)
    close_run(config.layout, state, run, {"a": (rest,)}, {})
    assert state.done_by("a", [SEGMENT]) == {SEGMENT}
