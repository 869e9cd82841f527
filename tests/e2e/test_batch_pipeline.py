"""From an HTTP post to rows in DuckDB: collector, sealed segments, the Spark job, load."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from eventpipe.archive.files import ArchivedSegment
from eventpipe.archive.read import lines
from eventpipe.archive.verify import verify
from eventpipe.destinations.duckdb import DuckDBDestination
from eventpipe.locks import FileLocks
from eventpipe.processing.batch import job
from eventpipe.processing.batch.job import process_once
from tests.conftest import WEB_JS, WEB_SERVER, RunningCollector, read_lines


def _post(c: RunningCollector, events: list[dict[str, Any]], *, server: bool = False) -> None:
    if server:
        response = httpx.post(c.url + "/api/v1/s2s/event", content=orjson.dumps(events),
                              headers={"X-Auth-Token": WEB_SERVER})  # fmt: skip
    else:
        response = httpx.post(c.url + "/api/v1/event", content=orjson.dumps(events),
                              params={"token": WEB_JS})  # fmt: skip
    assert response.status_code == 200, response.text


def _seal(c: RunningCollector) -> None:
    c.collector.segment_log.request_rotation("test")
    import time

    deadline = time.monotonic() + 5
    while c.layout.active_segments():
        assert time.monotonic() < deadline
        time.sleep(0.02)


def _query(c: RunningCollector, sql: str) -> list[tuple[Any, ...]]:
    warehouse = DuckDBDestination("warehouse", c.layout.warehouse, FileLocks(c.layout.locks))
    return warehouse.query(sql)[1]


def test_http_post_to_rows_in_duckdb(start_collector: Any, spark: Any) -> None:
    c = start_collector(destinations={"warehouse": {
        "type": "duckdb", "table_name_template": "{{ event_type }}",
    }})  # fmt: skip
    _post(c, [
        {"event_type": "page view", "url": "/a", "user": {"id": 1}, "event_id": "e1"},
        {"event_type": "page view", "url": "/b", "user": {"id": 2}, "event_id": "e2"},
        {"event_type": "signup", "plan": "pro", "event_id": "e3"},
        {"url": "/no-type", "event_id": "e4"},  # empty table name: skipped
    ])  # fmt: skip
    _seal(c)
    report = process_once(c.config, spark)
    assert report is not None
    assert report.loaded == {("warehouse", "page_view"): 2, ("warehouse", "signup"): 1}
    assert report.skipped == {"warehouse": 1}
    rows = _query(c, "SELECT eventn_ctx_event_id, url, user_id, api_key, source_ip "
                     "FROM page_view ORDER BY 1")  # fmt: skip
    # A browser key's ids live in its namespace (docs/collector.md).
    assert rows == [
        ("js:web:e1", "/a", 1, "web", "127.0.0.1"),
        ("js:web:e2", "/b", 2, "web", "127.0.0.1"),
    ]
    types = dict(_query(c, "SELECT column_name, data_type FROM information_schema.columns "
                           "WHERE table_name = 'page_view'"))  # fmt: skip
    assert types["_timestamp"] == "TIMESTAMP"
    assert types["user_id"] == "BIGINT"
    # The segment moved to the archive, compressed, intact.
    [archived] = report.archived
    assert archived.parent.parent == c.layout.archive
    assert len(list(lines(ArchivedSegment(archived)))) == 4
    assert verify(c.layout).ok
    assert c.layout.sealed_segments() == []
    assert process_once(c.config, spark) is None  # nothing left


def test_a_type_conflict_across_two_batches(start_collector: Any, spark: Any) -> None:
    # A template without placeholders is named once, sanitised like any other.
    c = start_collector(
        destinations={"warehouse": {"type": "duckdb", "table_name_template": "Web Events!"}}
    )
    _post(c, [{"n": 1, "event_id": "a"}], server=True)
    _seal(c)
    process_once(c.config, spark)
    # Second batch: n is a string now; "5" converts to the BIGINT column, "five" cannot.
    _post(c, [{"n": "5", "event_id": "b"}, {"n": "five", "event_id": "c"}], server=True)
    _seal(c)
    report = process_once(c.config, spark)
    assert report is not None
    assert report.failed == {"warehouse": 1}
    assert _query(c, "SELECT eventn_ctx_event_id, n FROM web_events_ ORDER BY 1") == [
        ("a", 1), ("b", 5),
    ]  # fmt: skip
    [failed] = read_lines([c.layout.failed_destination("warehouse")])
    assert failed["event"]["eventn_ctx"]["event_id"] == "c"
    assert failed["error"] == "column n (INT64) cannot take five"
    assert failed["stage"] == "loading"
    assert failed["table"] == "web_events_"


def test_unreadable_lines_go_to_failed_and_the_rest_loads(
    start_collector: Any, spark: Any, tmp_path: Path
) -> None:
    c = start_collector()
    _post(c, [{"event_id": "ok"}], server=True)
    _seal(c)
    [segment] = c.layout.sealed_segments()
    with segment.open("ab") as out:
        out.write(b'{"broken": \n')
    report = process_once(c.config, spark)
    assert report is not None
    assert report.corrupt == 1
    assert _query(c, "SELECT eventn_ctx_event_id FROM events") == [("ok",)]
    [failed] = read_lines(c.layout.failed_received("web"))
    assert failed["raw"] == '{"broken": '
    assert failed["stage"] == "processing"


def test_status_shows_backlog_loads_failures_and_skips(spark: Any, tmp_path: Path) -> None:
    from eventpipe.config import load_config
    from tests.process import run, write_config

    config_path = write_config(
        tmp_path / "eventpipe.yaml", tmp_path / "data", 0,
        destinations={"warehouse": {"type": "duckdb", "table_name_template": "{{ kind }}"}},
    )  # fmt: skip
    config = load_config(config_path).config
    incoming = config.layout.incoming
    incoming.mkdir(parents=True)
    events = [{"kind": "a", "_timestamp": "2026-11-21T10:00:00Z", "api_key": "web"},
              {"kind": "a", "_timestamp": "x", "api_key": "web"},
              {"_timestamp": "2026-11-21T10:00:00Z", "api_key": "web"}]  # fmt: skip
    (incoming / "incoming.tok=web-2026-11-21T10-00-00.000.log").write_bytes(
        b"".join(orjson.dumps(e) + b"\n" for e in events)
    )
    before = run("status", "-c", str(config_path))
    assert before.returncode == 0, before.stderr
    assert "1 segment(s)" in before.stdout
    assert "never" in before.stdout
    process_once(config, spark)
    after = run("status", "-c", str(config_path))
    [header] = [x for x in after.stdout.splitlines() if x.startswith("destination")]
    assert [c.strip() for c in header.split("|")][4] == "events loaded"  # not rows held
    [line] = [x for x in after.stdout.splitlines() if x.startswith("warehouse")]
    cells = [c.strip() for c in line.split("|")]
    assert cells[0:3] == ["warehouse", "duckdb", "0 segment(s), 0.0 MB"]
    assert cells[3] != "never"
    # events loaded, failed (a _timestamp that is not one), skipped (no kind), filtered
    assert cells[4:] == ["1", "1", "1", "0"]


def test_one_pipeline_per_data_directory(start_collector: Any, spark: Any) -> None:
    import pytest

    from eventpipe.processing.runtime.pipeline import PipelineBusyError, pipeline_lock

    c = start_collector()
    _post(c, [{"event_id": "x"}], server=True)
    _seal(c)
    # e.g. `eventpipe run` is processing
    with pipeline_lock(c.config), pytest.raises(PipelineBusyError, match="another pipeline"):
        process_once(c.config, spark)
    assert c.layout.sealed_segments() != []  # untouched
    report = process_once(c.config, spark)
    assert report is not None
    assert report.loaded == {("warehouse", "events"): 1}


def test_empty_keys_reach_the_table_as_unnamed_columns(start_collector: Any, spark: Any) -> None:
    # Spark's JSON reader would drop them; the collector names them before logging.
    c = start_collector()
    _post(c, [{"": 1, "props": {"": "v", "_unnamed": "w"}, "event_id": "e"}], server=True)
    _seal(c)
    process_once(c.config, spark)
    rows = _query(c, "SELECT _unnamed, props__unnamed, props__unnamed_1 FROM events")
    assert rows == [(1, "w", "v")]


def test_bools_mixed_with_numbers_are_typed_by_the_lattice(
    start_collector: Any, spark: Any
) -> None:
    # Spark reads a field that is a bool in some events and a number in others as text;
    # the lattice says BOOL < INT64 < FLOAT64, and a string token makes it STRING.
    c = start_collector(destinations={"warehouse": {
        "type": "duckdb", "table_name_template": "{{ kind }}"}})  # fmt: skip
    _post(c, [
        {"kind": "a", "v": True, "event_id": "a1"}, {"kind": "a", "v": 2, "event_id": "a2"},
        {"kind": "b", "v": "x", "event_id": "b1"},
        {"kind": "c", "v": 1.5, "event_id": "c1"}, {"kind": "c", "v": False, "event_id": "c2"},
        {"kind": "d", "v": "true", "event_id": "d1"}, {"kind": "d", "v": 3, "event_id": "d2"},
    ], server=True)  # fmt: skip
    _seal(c)
    process_once(c.config, spark)

    def typed(table: str) -> tuple[str, list[tuple[Any, ...]]]:
        [(sql_type,)] = _query(c, "SELECT data_type FROM information_schema.columns WHERE "
                                  f"table_name = '{table}' AND column_name = 'v'")  # fmt: skip
        return sql_type, _query(c, f"SELECT v FROM {table} ORDER BY eventn_ctx_event_id")

    assert typed("a") == ("BIGINT", [(1,), (2,)])
    assert typed("b") == ("VARCHAR", [("x",)])
    assert typed("c") == ("DOUBLE", [(1.5,), (0.0,)])
    assert typed("d") == ("VARCHAR", [("true",), ("3",)])  # "true" was a string


def test_a_resumed_run_writes_each_failed_event_once(
    start_collector: Any, spark: Any, monkeypatch: Any
) -> None:
    import pytest

    from eventpipe.processing.batch import load
    from eventpipe.processing.batch.run import DestinationsFailingError

    c = start_collector()
    _post(c, [{"event_id": "ok"}, {"event_id": "bad", "_timestamp": "x"}], server=True)
    _seal(c)
    [segment] = c.layout.sealed_segments()
    with segment.open("ab") as out:
        out.write(b"not json\n")
    real = load.load_files

    def crash(*args: Any, **kwargs: Any) -> int:
        raise RuntimeError("crash during the load")

    monkeypatch.setattr(load, "load_files", crash)
    # An error in a destination's part stops that destination (it may be its events':
    # a second one in the same run isolates them); the run resumes next time.
    with pytest.raises(DestinationsFailingError, match="crash during the load"):
        process_once(c.config, spark)
    monkeypatch.setattr(load, "load_files", real)
    report = process_once(c.config, spark)
    assert report is not None
    assert report.resumed
    assert (report.corrupt, report.failed) == (1, {"warehouse": 1})
    [failed] = read_lines([c.layout.failed_destination("warehouse")])
    assert failed["event"]["eventn_ctx"]["event_id"] == "bad"
    assert len(read_lines(c.layout.failed_received("web"))) == 1
    assert _query(c, "SELECT eventn_ctx_event_id FROM events") == [("ok",)]


@pytest.mark.parametrize("broadcast_up_to", [50_000, 2])
def test_failed_events_are_found_by_their_ids_few_or_many(
    spark: Any, tmp_path: Path, monkeypatch: Any, broadcast_up_to: int
) -> None:
    """Failed rows are joined with their events by a broadcast of their ids when they
    are few, and by a sort-merge join when there are more (2 here): the same failed/."""
    from eventpipe.processing.batch import failures
    from tests.conftest import make_config

    monkeypatch.setattr(failures, "BROADCAST_FAILED", broadcast_up_to)
    data = tmp_path / "data"
    (data / "incoming").mkdir(parents=True)
    events = [{"n": n, "_timestamp": f"2026-11-{n + 1:02d}T10:00:00Z"} for n in range(6)]
    events += [{"n": n, "_timestamp": f"not a time {n}"} for n in (6, 7, 8)]
    (data / "incoming" / "incoming.tok=web-2026-11-21T10-00-00.000.log").write_bytes(
        b"".join(orjson.dumps(e) + b"\n" for e in events)
    )
    config = make_config(data)
    report = process_once(config, spark)
    assert report is not None
    assert report.failed == {"warehouse": 3}
    failed = read_lines([config.layout.failed_destination("warehouse")])
    assert sorted((f["event"]["n"], f["error"]) for f in failed) == [
        (n, f"column _timestamp (TIMESTAMP) cannot take not a time {n}") for n in (6, 7, 8)
    ]


def test_a_runs_segments_are_compressed_once_ahead_and_moved_into_the_archive(
    spark: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    from eventpipe.archive import write
    from tests.conftest import make_config

    written: list[Path] = []
    real = write.write_segment

    def recording(source: Path, target: ArchivedSegment, settings: Any) -> Any:
        written.append(target.data)
        return real(source, target, settings)

    monkeypatch.setattr(write, "write_segment", recording)
    data = tmp_path / "data"
    (data / "incoming").mkdir(parents=True)
    for n in range(2):
        (data / "incoming" / f"incoming.tok=web-2026-11-21T10-00-0{n}.000.log").write_bytes(
            orjson.dumps({"n": n}) + b"\n"
        )
    config = make_config(data)
    report = process_once(config, spark)
    assert report is not None
    assert len(report.archived) == 2
    # Each compressed once, under tmp/archive-ahead/, then moved in.
    assert sorted(p.parent for p in written) == [config.layout.tmp / "archive-ahead"] * 2
    assert not any((config.layout.tmp / "archive-ahead").iterdir())
    assert verify(config.layout).ok
    assert not any(config.layout.incoming.glob("*.log"))


def test_runs_stage_their_files_in_the_work_dir(
    start_collector: Any, spark: Any, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    c = start_collector(processing={"work_dir": str(work)}, destinations={
        "warehouse": {"type": "duckdb"},
        "files": {"type": "parquet", "path": str(tmp_path / "lake")}})  # fmt: skip
    staged: list[str] = []
    real_rmtree = shutil.rmtree

    def rmtree(path: Any, *args: Any, **kwargs: Any) -> None:  # a run's files, as it ends
        if Path(path).is_relative_to(work):
            staged.extend(str(p.relative_to(work)) for p in Path(path).rglob("*.parquet"))
        real_rmtree(path, *args, **kwargs)

    _post(c, [{"event_id": "w", "n": 1}], server=True)
    _seal(c)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(shutil, "rmtree", rmtree)
        patch.setattr(job, "SMALL_BATCH_BYTES", 0)  # a copy of the events, as a large run
        report = process_once(c.config, spark)
    assert report is not None
    assert report.loaded == {("warehouse", "events"): 1, ("files", "events"): 1}
    # The read step's events (two destinations read them), each destination's rows.
    runs = {p.split("/")[1] for p in staged}
    assert runs == {"events", "dst=warehouse", "dst=files"}, staged
    assert not c.layout.root.joinpath("tmp").exists()


def _run_and_list_its_files(c: Any, spark: Any, *, large: bool) -> tuple[Any, list[str]]:
    """process_once of two sealed events, and what the run had in tmp/<run>/ as it
    ended (``large``: as a batch above job.SMALL_BATCH_BYTES)."""
    _post(c, [{"event_id": "s", "n": 1}, {"event_id": "t", "n": "two"}], server=True)
    _seal(c)
    staged: list[str] = []
    real_rmtree = shutil.rmtree

    def rmtree(path: Any, *args: Any, **kwargs: Any) -> None:
        staged.extend(p.name for p in Path(path).iterdir() if Path(path).is_dir())
        real_rmtree(path, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(shutil, "rmtree", rmtree)
        if large:
            patch.setattr(job, "SMALL_BATCH_BYTES", 0)
        return process_once(c.config, spark), staged


def test_a_large_run_into_one_destination_reads_its_json_where_it_is(
    start_collector: Any, spark: Any
) -> None:
    report, staged = _run_and_list_its_files(start_collector(), spark, large=True)
    assert report is not None
    assert report.loaded == {("warehouse", "events"): 2}
    assert "dst=warehouse" in staged
    assert "events" not in staged  # one destination: no copy for others to read
    assert "splits.json" in staged  # how its files split, for every attempt of the run


def test_a_small_run_keeps_no_copy_of_its_events(start_collector: Any, spark: Any) -> None:
    report, staged = _run_and_list_its_files(start_collector(), spark, large=False)
    assert report is not None
    assert report.loaded == {("warehouse", "events"): 2}
    assert "dst=warehouse" in staged
    assert "events" not in staged  # read where it is: 2 events are far below 8 MB
