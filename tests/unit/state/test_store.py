"""The state store: runs resume with their own segments; statuses per table."""

from __future__ import annotations

from pathlib import Path

from eventpipe.state.store import ALL_TABLES, StateStore


def test_an_interrupted_or_killed_run_is_resumed_with_its_segments(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state.sqlite")
    assert store.unfinished_run() is None
    run = store.begin_run(["s1", "s2"], "once")
    resumed = store.unfinished_run()  # killed: still 'running'
    assert resumed is not None
    assert (resumed.run_id, resumed.segments, resumed.resumed) == (run.run_id, ("s1", "s2"), True)
    store.finish_run(run.run_id, "interrupted", error="boom")  # stopped by an error
    again = store.unfinished_run()
    assert again is not None
    assert again.run_id == run.run_id
    store.finish_run(run.run_id, "done")
    assert store.unfinished_run() is None


def test_table_status_covers_every_segment_and_counts_attempts(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state.sqlite")
    store.record(["s1"], "dw", "events", ok=False, error="connection lost")
    assert not store.table_ok(["s1", "s2"], "dw", "events")
    store.record(["s1", "s2"], "dw", "events", ok=True, rows=5)
    assert store.table_ok(["s1", "s2"], "dw", "events")
    attempts = {(s, t): a for s, _, t, _, _, _, a in store.statuses()}
    assert attempts == {("s1", "events"): 2, ("s2", "events"): 1}
    assert store.segments_done(["s1", "s2"], ["dw"]) == []
    store.record(["s1"], "dw", ALL_TABLES, ok=True)
    assert store.segments_done(["s1", "s2"], ["dw"]) == ["s1"]
