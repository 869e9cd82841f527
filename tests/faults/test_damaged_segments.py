"""Damaged segments: a line of garbage, a flipped byte, a segment truncated mid-line, a
run of NUL bytes, an active segment with a torn tail. The collector starts, the valid
events load, and each damaged line is quarantined (failed/, its raw bytes kept) and
counted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from eventpipe.processing.batch.job import process_once
from tests.conftest import RunningCollector, read_lines
from tests.e2e.test_batch_pipeline import _post, _query, _seal
from tests.process import run, write_config


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def test_damaged_lines_are_quarantined_and_the_rest_loads(
    start_collector: Any, spark: Any, tmp_path: Path
) -> None:
    c = start_collector()
    _post(c, [{"event_id": f"a{i}"} for i in range(20)], server=True)
    _seal(c)
    _post(c, [{"event_id": f"b{i}"} for i in range(20)], server=True)
    _seal(c)
    first, second = c.layout.sealed_segments()
    lines = _lines(first)
    flipped = bytearray(lines[10])
    flipped[0] ^= 0x01  # '{' -> 'z'
    lines[10] = bytes(flipped)
    lines.insert(5, b"\x8f\x00garbage that is not JSON\n")
    lines.insert(15, b"\x00" * 40 + b"\n")  # preallocated space a crash left behind
    first.write_bytes(b"".join(lines))
    data = second.read_bytes()[:-30]  # truncated in the middle of its last line
    second.write_bytes(data)

    # An active segment torn by a crash mid-write: the collector starts anyway.
    c.stop()
    c0 = orjson.dumps({"eventn_ctx": {"event_id": "c0"}, "api_key": "web", "src": "api"})
    (c.layout.incoming / "incoming.tok=web.log").write_bytes(c0 + b'\n{"event_id": "c1", "api_k')
    c2 = RunningCollector(c.config)
    try:
        _post(c2, [{"event_id": "c2"}], server=True)
        _seal(c2)
    finally:
        c2.stop()

    report = process_once(c.config, spark)
    assert report is not None
    loaded = {r[0] for r in _query(c, "SELECT eventn_ctx_event_id FROM events")}
    expected = {f"a{i}" for i in range(20)} - {"a10"}
    expected |= {f"b{i}" for i in range(19)} | {"c0", "c2"}
    assert loaded == expected
    # Quarantined with their bytes: garbage, NULs, the flipped line, the truncated one.
    failed = read_lines(c.layout.failed_received("web"))
    unreadable = [f for f in failed if f["stage"] == "processing"]
    assert report.corrupt == len(unreadable) == 4
    raws = [f["raw"] for f in unreadable]
    assert bytes(flipped).rstrip(b"\n").decode() in raws  # as it is on disk
    assert data.splitlines()[-1].decode() in raws  # the truncated line
    assert any("garbage that is not JSON" in r for r in raws)
    # The torn tail found at start-up is quarantined too, by the collector.
    torn = [f for f in failed if f["stage"] != "processing"]
    assert [t["raw"] for t in torn] == ['{"event_id": "c1", "api_k']
    assert not c.layout.sealed_segments()  # done and archived


def test_status_counts_the_quarantined_lines(tmp_path: Path) -> None:
    data = tmp_path / "data"
    config = write_config(tmp_path / "eventpipe.yaml", data, 0)
    (data / "failed").mkdir(parents=True)
    error = {"error": "line is not a JSON object", "stage": "processing", "raw": "x"}
    (data / "failed" / "failed.tok=web.log").write_bytes(orjson.dumps(error) + b"\n")
    result = run("status", "-c", str(config))
    assert result.returncode == 0, result.stderr
    assert "failed/failed.tok=*.log: 1 event(s) refused at the collector or unreadable" in (
        result.stdout
    )
