"""`eventpipe replay failed`: fixed events load, the rest stay failed with their new error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lz4.frame
import orjson

from eventpipe.config import DuckDBConfig
from eventpipe.processing.batch.job import process_once
from eventpipe.processing.modes.replay import replay_failed
from tests.conftest import read_lines
from tests.e2e.test_batch_pipeline import _post, _query, _seal


def test_replay_loads_what_now_succeeds_and_keeps_what_fails_again(
    start_collector: Any, spark: Any
) -> None:
    c = start_collector(destinations={"warehouse": {
        "type": "duckdb", "table_name_template": "{{ day | date('%Y') }}"}})  # fmt: skip
    _post(c, [{"event_id": "a", "day": "2026-01-01T00:00:00Z", "n": 1}], server=True)
    _seal(c)
    process_once(c.config, spark)  # table _2026, n BIGINT
    _post(c, [
        {"event_id": "b", "day": "soon", "n": 2},       # template error: not a timestamp
        {"event_id": "c", "day": "later", "n": "five"},  # template error too
    ], server=True)  # fmt: skip
    _seal(c)
    first = process_once(c.config, spark)
    assert first is not None
    assert first.failed == {"warehouse": 2}
    failed_file = c.layout.failed_destination("warehouse")
    assert {e["event"]["eventn_ctx"]["event_id"] for e in read_lines([failed_file])} == {"b", "c"}

    # The operator fixes the template and replays.
    fixed = c.config.model_copy(update={"destinations": {
        "warehouse": DuckDBConfig(table_name_template="2026", mappings={
            "fields": [{"action": "remove", "src": "/day"}]})}})  # fmt: skip
    report = replay_failed(fixed, spark, "warehouse")
    assert report is not None
    assert report.loaded == {("warehouse", "_2026"): 1}
    assert _query(c, "SELECT eventn_ctx_event_id, n FROM _2026 ORDER BY 1") == [
        ("a", 1), ("b", 2),
    ]  # fmt: skip
    # "five" cannot go into the BIGINT column: c stays failed, with its new error.
    [again] = read_lines([failed_file])
    assert again["event"]["eventn_ctx"]["event_id"] == "c"
    assert again["error"] == "column n (INT64) cannot take five"
    assert again["stage"] == "loading"
    # status agrees with failed/: one event there now (it said 2, the failures ever).
    from tests.process import run, write_config

    destinations = c.config.model_dump(mode="json")["destinations"]
    config_file = write_config(c.layout.root.parent / "status.yaml", c.layout.root, 1,
                               destinations=destinations)  # fmt: skip
    shown = run("status", "-c", str(config_file))
    [line] = [x for x in shown.stdout.splitlines() if x.startswith("warehouse ")]
    assert [cell.strip() for cell in line.split("|")][5] == "1"
    # Why: the table's contract (types freeze, the default) held it back, counted.
    assert (
        "warehouse: table _2026: data_type:freeze 1 event(s) (contracts, "
        "docs/contracts.md)" in shown.stdout.splitlines()
    )
    # The replayed file is archived whole; nothing is left to replay in failed/replay/.
    [archived] = report.archived
    assert archived.name.startswith("replayed.dst=warehouse.")
    with lz4.frame.open(archived, "rb") as frames:  # LZ4 frames, the archive's one format
        assert len(frames.read().splitlines()) == 2
    assert list((c.layout.failed / "replay").iterdir()) == []
    # Replaying again retries c alone.
    second = replay_failed(fixed, spark, "warehouse")
    assert second is not None
    assert second.failed == {"warehouse": 1}
    assert sum(second.loaded.values()) == 0


def test_an_interrupted_replay_resumes_without_loading_twice(
    start_collector: Any, spark: Any, tmp_path: Path
) -> None:
    c = start_collector()
    failed_file = c.layout.failed_destination("warehouse")
    failed_file.parent.mkdir(parents=True, exist_ok=True)
    event = {"event_id": "r1", "_timestamp": "2026-11-21T10:00:00Z", "api_key": "web"}
    failed_file.write_bytes(orjson.dumps({"event": event, "error": "x"}) + b"\n")
    assert replay_failed(c.config, spark, "warehouse") is not None
    # The same replay file again (as if the process died before archiving it).
    replay_dir = c.layout.failed / "replay"
    [archived] = list(c.layout.archive.rglob("replayed.*"))
    restored = replay_dir / archived.name.removesuffix(".lz4").replace("replayed", "replaying")
    with lz4.frame.open(archived, "rb") as frames:
        restored.write_bytes(frames.read())
    archived.unlink()
    assert replay_failed(c.config, spark, "warehouse") is not None
    assert _query(c, "SELECT count(*) FROM events") == [(1,)]


def test_nothing_to_replay(start_collector: Any, spark: Any) -> None:
    c = start_collector()
    assert replay_failed(c.config, spark, "warehouse") is None


def test_a_selection_replays_only_its_records_and_the_rest_stay(
    start_collector: Any, spark: Any
) -> None:
    from eventpipe.processing.modes.replay import Selection

    c = start_collector()
    failed_file = c.layout.failed_destination("warehouse")
    failed_file.parent.mkdir(parents=True, exist_ok=True)

    def record(event_id: str, error: str) -> bytes:
        event = {"eventn_ctx": {"event_id": event_id}, "_timestamp": "2026-11-21T10:00:00Z",
                 "api_key": "web"}  # fmt: skip
        return orjson.dumps({"event": event, "error": error})

    failed_file.write_bytes(b"\n".join([record("r1", "x"), record("r2", "x"),
                                        record("r3", "y")]) + b"\n")  # fmt: skip
    # Of reason x and event r1: r1 alone.
    report = replay_failed(c.config, spark, "warehouse", Selection("x", frozenset({"r1"})))
    assert report is not None
    assert _query(c, "SELECT eventn_ctx_event_id FROM events") == [("r1",)]
    left = [r["event"]["eventn_ctx"]["event_id"] for r in read_lines([failed_file])]
    assert left == ["r2", "r3"]
    # A selection that takes nothing replays nothing and changes nothing.
    assert replay_failed(c.config, spark, "warehouse", Selection("z")) is None
    # Interrupted between writing its file and taking its records out of failed/: the
    # resumed replay takes them out, so none is in both.
    replay_dir = c.layout.failed / "replay"
    pending = replay_dir / "replaying.dst=warehouse.2026-11-28T10-00-00.000000-selected.log"
    pending.write_bytes(record("r3", "y") + b"\n")
    assert replay_failed(c.config, spark, "warehouse") is not None
    assert _query(c, "SELECT eventn_ctx_event_id FROM events ORDER BY 1") == [("r1",), ("r3",)]
    assert [r["event"]["eventn_ctx"]["event_id"] for r in read_lines([failed_file])] == ["r2"]
