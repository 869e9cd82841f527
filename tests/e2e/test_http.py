"""The HTTP sink end to end: HTTP post to the collector, the batch job on Spark, requests
to a real addEvents-like server (tests/addevents.py), failures in failed/."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from eventpipe.processing.job import process_once
from tests.addevents import AddEventsServer, addevents_server
from tests.e2e.test_batch_pipeline import _post, _query, _seal


@pytest.fixture
def api() -> Iterator[AddEventsServer]:
    with addevents_server() as running:
        yield running


def test_events_reach_the_api_in_sessions_and_refused_ones_fail_with_its_answer(
    start_collector: Any, spark: Any, api: AddEventsServer
) -> None:
    c = start_collector(destinations={
        "warehouse": {"type": "duckdb"},
        "dataset": {"type": "http", "url": api.url, "headers": {"Authorization": "Bearer t"},
                    "group_by": ["event_type"], "max_payload_bytes": 4096,
                    "retry_initial_seconds": 0.1, "retry_max_seconds": 0.5},
    })  # fmt: skip
    events = [{"event_type": ("click", "view")[i % 2], "seq": i, "marker": f"m{i}",
               "page": {"url": f"/p/{i}"}} for i in range(200)]  # fmt: skip
    _post(c, events, server=True)
    _seal(c)
    api.behaviour.reject_markers = {"m7"}
    api.behaviour.unavailable_until = time.monotonic() + 1.5  # a restart, compressed
    report = process_once(c.config, spark)
    assert report is not None
    assert report.loaded[("dataset", "*sent*")] == 199
    assert report.failed["dataset"] == 1
    assert api.violations == []
    delivered = api.delivered
    assert sorted(e["attrs"]["seq"] for e in delivered) == [i for i in range(200) if i != 7]
    sample = next(e for e in delivered if e["attrs"]["seq"] == 3)
    assert sample["attrs"]["page_url"] == "/p/3"  # flattened like a table's columns
    assert "event_type" not in sample["attrs"]  # moved into the session info
    assert int(sample["ts"]) > 1_600_000_000 * 10**9  # _timestamp, in nanoseconds
    sessions = {r.session: r.session_info["event_type"] for r in api.requests}
    assert sorted(sessions.values()) == ["click", "view"]
    assert max(r.size for r in api.requests) <= 4096
    assert all(r.headers["x-eventpipe-session"] == r.session for r in api.requests)
    # One key per payload: retries of a payload share it, different payloads never do.
    keys = {r.headers["idempotency-key"]: r.events for r in api.requests}
    assert len({orjson.dumps(e) for e in keys.values()}) == len(keys)
    [failed] = [orjson.loads(x) for x in c.layout.failed_destination("dataset").read_bytes()
                .splitlines()]  # fmt: skip
    assert failed["event"]["marker"] == "m7"
    assert failed["stage"] == "sending"
    assert failed["error"].startswith("HTTP 400")
    # The other destination got everything, the segment is archived once both are done.
    assert _query(c, "SELECT count(*) FROM events") == [(200,)]
    assert not c.layout.sealed_segments()
