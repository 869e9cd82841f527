"""The state store: runs resume with their own segments; statuses per table. Every test
runs on both databases the store can live in: SQLite and PostgreSQL."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest

from eventpipe.errors import TransientError
from eventpipe.state.db import PostgresDatabase
from eventpipe.state.records import ContractCount, SchemaChange
from eventpipe.state.store import ALL_TABLES, REPROCESS, DayVersion, StateStore, micro_batch
from tests.process import free_port

HELD = ContractCount("table", "events", "columns:freeze", 2)


DAY = re.compile(r"^\d{4}-\d{2}-\d{2}$")


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> StateStore:
    if request.param == "sqlite":
        return StateStore(tmp_path / "state.sqlite")
    dsn = request.getfixturevalue("postgres_dsn")
    return StateStore(PostgresDatabase(dsn, request.getfixturevalue("postgres_schema")))


def test_an_interrupted_or_killed_run_is_resumed_with_its_segments(store: StateStore) -> None:
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


def test_table_status_covers_every_segment_and_counts_attempts(store: StateStore) -> None:
    store.record(["s1"], "dw", "events", ok=False, error="connection lost")
    assert not store.table_ok(["s1", "s2"], "dw", "events")
    store.record(["s1", "s2"], "dw", "events", ok=True, rows=5)
    assert store.table_ok(["s1", "s2"], "dw", "events")
    attempts = {(s, t): a for s, _, t, _, _, _, a in store.statuses()}
    assert attempts == {("s1", "events"): 2, ("s2", "events"): 1}
    assert store.segments_done(["s1", "s2"], ["dw"]) == []
    store.record(["s1"], "dw", ALL_TABLES, ok=True)
    assert store.segments_done(["s1", "s2"], ["dw"]) == ["s1"]


def test_a_batch_of_several_segments_counts_its_rows_once(store: StateStore) -> None:
    store.record(["s1", "s2", "s3"], "dw", "events", ok=True, rows=100)
    store.record(["s1", "s2", "s3"], "dw", "events", ok=True, rows=100)  # a retry
    store.record(["s4"], "dw", "events", ok=True, rows=5)
    assert store.summary("dw").rows_loaded == 105


def test_a_streams_older_micro_batches_fold_into_one_row_per_table(store: StateStore) -> None:
    store.record(["s1"], "live", "events", ok=True, rows=7)  # a segment: never folded
    store.record(["s1"], "batch", "events", ok=True, rows=3)
    for epoch in range(12):  # past 9 -> 10: numbers, not text, order the run ids
        name = micro_batch("live", epoch)
        store.record([name], "live", "events", ok=True, rows=10, run_id=f"stream-live-{epoch}")
        if epoch % 2:
            store.record([name], "live", "clicks", ok=True, rows=1)
        store.record([name], "live", ALL_TABLES, ok=True)
        store.record_destination_run(f"stream-live-{epoch}", "live", skipped=1, failed=2,
                                     filtered=3, contracts=[HELD])  # fmt: skip
        store.fold_stream("live", epoch)
    before = store.summary("live")
    assert before.rows_loaded == 7 + 12 * 10 + 6
    assert (before.skipped, before.failed, before.filtered) == (12, 24, 36)
    segments = {(s, t): r for s, d, t, _, r, _, _ in store.statuses() if d == "live"}
    # One folded row per table and UTC day the micro-batches were recorded on: here one.
    [day] = {s.removeprefix("queue.dst=live/folded-") for s, _ in segments if "folded" in s}
    assert DAY.match(day)
    assert segments == {
        ("s1", "events"): 7,
        (f"queue.dst=live/folded-{day}", "events"): 110,
        (f"queue.dst=live/folded-{day}", "clicks"): 5,
        (micro_batch("live", 11), "events"): 10,  # the latest keeps its own records
        (micro_batch("live", 11), "clicks"): 1,
        (micro_batch("live", 11), ALL_TABLES): 0,
    }
    assert store.table_ok([micro_batch("live", 11)], "live", "events")
    with store.db.transaction() as db:
        runs = db.execute("SELECT run_id FROM destination_runs WHERE destination = 'live' "
                          "ORDER BY 1").fetchall()  # fmt: skip
    assert [tuple(r) for r in runs] == [("stream-live-11",), (f"stream-live-folded-{day}",)]
    assert store.contract_counts("live") == [replace(HELD, events=24, destination="live")]
    with store.db.transaction() as db:
        kept = db.execute("SELECT run_id, events FROM contract_counts ORDER BY 1").fetchall()
    assert [tuple(r) for r in kept] == [("stream-live-11", 2), (f"stream-live-folded-{day}", 22)]
    assert store.summary("batch").rows_loaded == 3  # other destinations untouched


def test_the_events_a_streams_micro_batches_read_are_kept_through_folding(
    store: StateStore,
) -> None:
    assert store.stream_counts("live").events_read == 0
    for epoch in range(4):
        store.record_destination_run(f"stream-live-{epoch}", "live", skipped=0, failed=0)
        store.record_read(f"stream-live-{epoch}", "live", 10 + epoch)
        store.fold_stream("live", epoch)
    assert store.stream_counts("live").events_read == 10 + 11 + 12 + 13
    # A micro-batch that did not record it (made before eventpipe did): not known since.
    store.record_destination_run("stream-live-4", "live", skipped=0, failed=0)
    assert store.stream_counts("live").events_read is None
    store.record_read("stream-live-5", "live", 1)  # no such run: changes nothing
    store.fold_stream("live", 5)
    assert store.stream_counts("live").events_read is None


def test_a_streams_micro_batches_are_counted_by_the_day_they_were_recorded_on(
    store: StateStore,
) -> None:
    days = ["2026-11-20", "2026-11-21", "2026-11-21"]
    for epoch, day in enumerate(days):
        run = f"stream-live-{epoch}"
        store.record([micro_batch("live", epoch)], "live", "events", ok=True, rows=10 + epoch,
                     run_id=run)  # fmt: skip
        store.record_destination_run(run, "live", skipped=0, failed=1, contracts=[HELD])
        store.record_read(run, "live", 11 + epoch)
        with store.db.transaction() as db:  # as if recorded on that day
            db.execute("UPDATE segment_status SET updated_at = ? WHERE run_id = ?",
                       (f"{day}T12:00:00.000+00:00", run))  # fmt: skip
            db.execute("UPDATE destination_runs SET finished_at = ? WHERE run_id = ?",
                       (f"{day}T12:00:00.000+00:00", run))  # fmt: skip
    store.fold_stream("live", 2)  # the first two folded, one row per day
    with store.db.transaction() as db:
        folded = db.execute("SELECT run_id FROM destination_runs ORDER BY 1").fetchall()
    assert [r[0] for r in folded] == [
        "stream-live-2", "stream-live-folded-2026-11-20", "stream-live-folded-2026-11-21",
    ]  # fmt: skip
    first = store.stream_counts("live", "2026-11-20", "2026-11-21")
    assert (first.rows_loaded, first.failed, first.events_read) == (10, 1, 11)
    assert first.contracts == (replace(HELD, destination="live"),)
    second = store.stream_counts("live", "2026-11-21", "2026-11-22")
    assert (second.rows_loaded, second.failed, second.events_read) == (11 + 12, 2, 12 + 13)
    assert second.contracts == (replace(HELD, events=4, destination="live"),)
    every = store.stream_counts("live")
    assert (every.rows_loaded, every.events_read) == (10 + 11 + 12, 11 + 12 + 13)


def test_history_is_newest_first_even_within_one_millisecond(store: StateStore) -> None:
    assert store.history() == []
    runs = [store.begin_run([f"s{n}"], "once") for n in range(5)]
    with store.db.transaction() as db:  # started in one millisecond: the order of insertion
        db.execute("UPDATE runs SET started_at = ?", ("2026-11-20T10:00:00.000+00:00",))
    for run in runs[:4]:
        store.finish_run(run.run_id, "done")
    store.record(["s0"], "dw", "events", ok=True, rows=3, run_id=runs[0].run_id)
    store.record(["s0"], "dw", "events", ok=True, rows=4, run_id=runs[0].run_id)  # a retry
    store.record_destination_run(runs[0].run_id, "dw", skipped=0, failed=0, contracts=[HELD])
    history = store.history(limit=10)
    assert [r.run_id for r in history] == [r.run_id for r in reversed(runs)]
    assert [r.status for r in history] == ["running"] + ["done"] * 4
    assert [(t.table, t.rows) for t in history[-1].tables] == [("events", 4)]
    assert history[-1].contracts == (replace(HELD, destination="dw"),)
    assert [r.run_id for r in store.unfinished_runs()] == [runs[4].run_id]
    assert len(store.history(limit=2)) == 2


def test_day_versions_record_each_version_and_a_rebuild_replaces_them(store: StateStore) -> None:
    store.record_days("dw", ["2026-11-18", "2026-11-19"], "v1", "run-a")
    store.record_days("dw", ["2026-11-19"], "v1", "run-b")  # the same again: one record
    store.record_days("dw", ["2026-11-19"], "v2", "run-b")
    store.record_days("other", ["2026-11-19"], "v1", "run-b")
    found = store.day_versions("dw", "2026-11-18", "2026-11-19")
    assert found == {
        "2026-11-18": [DayVersion("2026-11-18", "v1", None, "run-a")],
        "2026-11-19": [DayVersion("2026-11-19", "v1", None, "run-a"),
                       DayVersion("2026-11-19", "v2", None, "run-b")],
    }  # fmt: skip
    store.begin_reprocess("rp-1", "reprocess.dst=dw/2026-11-19", "dw", "v2")
    store.record(["reprocess.dst=dw/2026-11-19"], "dw", "events", ok=True, rows=9, run_id="rp-1")
    store.reprocessed_days("dw", ["2026-11-19"], "v2", {"archive/a.lz4": "sha"}, "rp-1")
    found = store.day_versions("dw", "2026-11-01", "2026-11-30")
    assert found["2026-11-19"] == [DayVersion("2026-11-19", "v2", {"archive/a.lz4": "sha"}, "rp-1")]
    assert found["2026-11-18"] == [DayVersion("2026-11-18", "v1", None, "run-a")]
    [other] = store.day_versions("other", "2026-11-19", "2026-11-19")["2026-11-19"]
    assert other.code_version == "v1"  # other destinations untouched
    [rebuilt] = [r for r in store.history() if r.run_id == "rp-1"]
    assert (rebuilt.trigger, rebuilt.status) == (REPROCESS, "done")
    assert store.loaded_tables("reprocess.dst=dw/2026-11-19", "dw") == []  # progress dropped


def test_reprocess_runs_resume_by_entry_and_are_not_resumed_by_process(store: StateStore) -> None:
    store.begin_reprocess("rp-1", "reprocess.dst=dw/2026-11-19", "dw", "v1")
    store.begin_reprocess("rp-2", "reprocess.dst=dw/2026-11-20", "dw", "v1")
    store.record(["reprocess.dst=dw/2026-11-19"], "dw", "events", ok=True, rows=2, run_id="rp-1")
    store.finish_run("rp-1", "interrupted", error="killed")
    assert store.unfinished_runs() == []  # process leaves them to reprocess
    assert store.unfinished_reprocesses("reprocess.dst=dw/") == [
        ("rp-1", "reprocess.dst=dw/2026-11-19"),
        ("rp-2", "reprocess.dst=dw/2026-11-20"),
    ]
    assert store.loaded_tables("reprocess.dst=dw/2026-11-19", "dw") == ["events"]
    store.begin_reprocess("rp-1", "reprocess.dst=dw/2026-11-19", "dw", "v1")  # resumed
    assert store.history()[-1].status == "running"
    store.abandon_run("rp-1", "the days changed")
    assert store.unfinished_reprocesses("reprocess.dst=dw/") == [
        ("rp-2", "reprocess.dst=dw/2026-11-20")
    ]
    assert store.loaded_tables("reprocess.dst=dw/2026-11-19", "dw") == []
    assert store.destination_tables("dw") == ["events"]  # the history keeps it


def test_cursors_only_move_forward_and_acknowledged_segments_are_done(store: StateStore) -> None:
    store.advance("dw", "s1", 5, done=False, run_id="step")
    store.advance("dw", "s1", 3, done=False, run_id="step")  # an older step: kept at 5
    store.advance("dw", "s2", 1, done=False, run_id="step")
    assert store.cursors("dw") == {"s1": 5, "s2": 1}
    store.advance("dw", "s1", 9, done=True, run_id="step")
    assert store.cursors("dw") == {"s2": 1}
    store.acknowledge("dw", ["s2", "s3"])
    assert store.cursors("dw") == {}
    assert store.done_by("dw", ["s1", "s2", "s3", "s4"]) == {"s1", "s2", "s3"}
    assert store.segments_done(["s1", "s4"], ["dw"]) == ["s1"]


def test_a_destinations_event_counts_are_replaced_not_added(store: StateStore) -> None:
    store.record_destination_run("run-a", "dw", skipped=1, failed=2, contracts=[HELD])
    plan = ContractCount("plan", "checkout/1", "required", 5)
    store.record_destination_run("run-a", "dw", skipped=3, failed=4,  # the run's retry
                                 contracts=[replace(HELD, events=3), plan])  # fmt: skip
    store.record_destination_run("run-b", "dw", skipped=10, failed=0, contracts=[HELD])
    summary = store.summary("dw")
    assert (summary.skipped, summary.failed) == (13, 4)
    assert [str(c) for c in store.contract_counts("dw")] == [
        "plan checkout/1: required 5",
        "table events: columns:freeze 5",
    ]


def test_concurrent_writers_lose_no_update(store: StateStore) -> None:
    def write(worker: int) -> None:
        for n in range(25):
            store.record(["s1"], "dw", "events", ok=True, rows=1)
            store.record([f"w{worker}-{n}"], "dw", "events", ok=True, rows=1)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(write, range(4)))  # raises what a thread raised
    attempts = {s: a for s, _, _, _, _, _, a in store.statuses()}
    assert attempts["s1"] == 100
    assert len(attempts) == 101
    [progress] = store.tables("dw")
    assert (progress.table, progress.batches_ok, progress.rows) == ("events", 101, 101)


def test_postgres_stores_made_at_once_by_several_processes_share_one_schema(
    postgres_dsn: str, postgres_schema: str
) -> None:
    def open_store(_: int) -> None:
        store = StateStore(PostgresDatabase(postgres_dsn, postgres_schema))
        store.record(["s1"], "dw", "events", ok=True)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(open_store, range(4)))  # raises what a thread raised
    store = StateStore(PostgresDatabase(postgres_dsn, postgres_schema))
    assert [a for *_, a in store.statuses()] == [4]
    with store.db.transaction() as db:  # text compares byte by byte, whatever the server's locale
        collations = db.execute(
            "SELECT DISTINCT collation_name FROM information_schema.columns "
            "WHERE table_schema = ? AND data_type = 'text'",
            (postgres_schema,),
        ).fetchall()
    assert [tuple(c) for c in collations] == [("C",)]


def test_a_postgres_store_that_is_down_says_where_without_the_password() -> None:
    port = free_port()  # nothing listens there
    with pytest.raises(TransientError) as raised:
        StateStore(PostgresDatabase(f"postgresql://eventpipe:hunter2@127.0.0.1:{port}/state", "ep"))
    message = str(raised.value)
    assert f"127.0.0.1:{port}/state" in message
    assert "cannot connect" in message
    assert "hunter2" not in message
    assert "state.dsn" in (raised.value.fix or "")


def test_a_store_made_before_filtered_counts_gains_the_column(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "state.sqlite"
    with sqlite3.connect(path) as db:  # destination_runs as first released
        db.execute("CREATE TABLE destination_runs (run_id TEXT NOT NULL, destination TEXT "
                   "NOT NULL, skipped INTEGER NOT NULL, failed INTEGER NOT NULL, finished_at "
                   "TEXT NOT NULL, PRIMARY KEY (run_id, destination))")  # fmt: skip
        db.execute("INSERT INTO destination_runs VALUES ('run-a', 'dw', 1, 2, 'then')")
    store = StateStore(path)
    store.record_destination_run("run-b", "dw", skipped=0, failed=0, filtered=5)
    summary = store.summary("dw")
    assert (summary.skipped, summary.failed, summary.filtered) == (1, 2, 5)


def test_schema_changes_are_kept_once_newest_first(store: StateStore) -> None:
    first = [SchemaChange("wh", "page", "create", c, "INT64", "run-1", "2026-11-28T10:00:00")
             for c in ("n", "id")]  # fmt: skip
    store.record_schema_changes(first)
    store.record_schema_changes(first)  # a resumed run repeats its patch: kept once
    store.record_schema_changes([
        SchemaChange("wh", "page", "add", "coupon", "STRING", "run-2", "2026-11-28T11:00:00"),
        SchemaChange("other", "page", "add", "x", "BOOL", "run-2", "2026-11-28T11:00:00"),
    ])  # fmt: skip
    changes = store.schema_changes("wh")
    assert [(c.change, c.column, c.run_id) for c in changes] == [
        ("add", "coupon", "run-2"),
        ("create", "id", "run-1"),
        ("create", "n", "run-1"),
    ]
    assert store.recent_loads("wh") == []


def test_the_history_of_a_range_of_start_times(store: StateStore) -> None:
    import time

    for _ in range(3):
        run = store.begin_run(["s"], "once")
        store.finish_run(run.run_id, "done")
        time.sleep(0.005)  # starts are recorded to the millisecond: each its own
    every = store.history(10)
    ids = [r.run_id for r in every]  # the newest first
    starts = [r.started_at for r in every]
    assert [r.run_id for r in store.history(10, since=starts[1])] == ids[:2]
    assert [r.run_id for r in store.history(10, until=starts[1])] == ids[2:]
    assert store.history(10, since="2999-01-01") == []
    assert [r.run_id for r in store.history(10, since=starts[-1][:10])] == ids
