"""The state store: runs resume with their own segments; statuses per table."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from eventpipe.state.store import ALL_TABLES, StateStore, micro_batch


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


def test_a_batch_of_several_segments_counts_its_rows_once(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state.sqlite")
    store.record(["s1", "s2", "s3"], "dw", "events", ok=True, rows=100)
    store.record(["s1", "s2", "s3"], "dw", "events", ok=True, rows=100)  # a retry
    store.record(["s4"], "dw", "events", ok=True, rows=5)
    assert store.summary("dw").rows_loaded == 105


def test_a_streams_older_micro_batches_fold_into_one_row_per_table(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state.sqlite")
    store.record(["s1"], "live", "events", ok=True, rows=7)  # a segment: never folded
    store.record(["s1"], "batch", "events", ok=True, rows=3)
    for epoch in range(12):  # past 9 -> 10: numbers, not text, order the run ids
        name = micro_batch("live", epoch)
        store.record([name], "live", "events", ok=True, rows=10, run_id=f"stream-live-{epoch}")
        if epoch % 2:
            store.record([name], "live", "clicks", ok=True, rows=1)
        store.record([name], "live", ALL_TABLES, ok=True)
        store.record_destination_run(f"stream-live-{epoch}", "live", skipped=1, failed=2)
        store.fold_stream("live", epoch)
    before = store.summary("live")
    assert before.rows_loaded == 7 + 12 * 10 + 6
    assert (before.skipped, before.failed) == (12, 24)
    segments = {(s, t): r for s, d, t, _, r, _, _ in store.statuses() if d == "live"}
    assert segments == {
        ("s1", "events"): 7,
        ("queue.dst=live/folded", "events"): 110,
        ("queue.dst=live/folded", "clicks"): 5,
        (micro_batch("live", 11), "events"): 10,  # the latest keeps its own records
        (micro_batch("live", 11), "clicks"): 1,
        (micro_batch("live", 11), ALL_TABLES): 0,
    }
    assert store.table_ok([micro_batch("live", 11)], "live", "events")
    with sqlite3.connect(store.path) as db:
        runs = db.execute("SELECT run_id FROM destination_runs WHERE destination = 'live' "
                          "ORDER BY 1").fetchall()  # fmt: skip
    assert runs == [("stream-live-11",), ("stream-live-folded",)]
    assert store.summary("batch").rows_loaded == 3  # other destinations untouched
