"""The HTTP sink end to end: HTTP post to the collector, the batch job on Spark, requests
to a real addEvents-like server (tests/addevents.py), failures in failed/."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from eventpipe.errors import QueryError
from eventpipe.processing.batch.job import process_once
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


def test_a_stream_sink_waits_out_an_outage_while_a_stream_warehouse_keeps_loading(
    start_collector: Any, spark: Any, api: AddEventsServer
) -> None:
    import duckdb

    from eventpipe.processing.modes import stream

    c = start_collector(destinations={
        "warehouse": {"type": "duckdb", "mode": "stream"},
        "dataset": {"type": "http", "mode": "stream", "url": api.url, "group_by": ["host"],
                    "retry_initial_seconds": 0.2, "retry_max_seconds": 1,
                    "max_buffer_bytes": 8192, "max_payload_bytes": 2048},
    })  # fmt: skip

    def rows() -> int:
        try:
            return int(_query(c, "SELECT count(*) FROM events")[0][0])
        except (duckdb.Error, QueryError):  # not created yet, or held by the stream's load
            return -1

    def wait_until(done: Any, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not done():
            assert time.monotonic() < deadline
            time.sleep(0.2)

    streams = stream.StreamSupervisor(spark, c.config)
    streams.start()
    try:
        outage_ends = time.monotonic() + 25.0  # a 120 s restart, compressed
        api.behaviour.unavailable_until = outage_ends
        _post(c, [{"host": f"h{i % 2}", "seq": i, "text": "x" * 100} for i in range(50)],
              server=True)  # fmt: skip
        wait_until(lambda: rows() == 50, 60)
        _post(c, [{"host": f"h{i % 2}", "seq": i, "text": "x" * 100} for i in range(50, 100)],
              server=True)  # fmt: skip
        wait_until(lambda: rows() == 100, 60)
        # The warehouse loaded both batches while the API was down.
        assert time.monotonic() < outage_ends
        assert api.delivered == []
        wait_until(lambda: len(api.delivered) >= 100, 90)
    finally:
        streams.stop()
    assert api.violations == []
    assert sorted(e["attrs"]["seq"] for e in api.delivered) == list(range(100))  # each once
    assert max(r.size for r in api.requests) <= 2048
    assert not c.layout.failed_destination("dataset").exists()


def test_a_batch_run_loads_its_tables_while_its_http_sink_waits_for_the_api(
    start_collector: Any, spark: Any, api: AddEventsServer
) -> None:
    import threading

    import duckdb

    c = start_collector(destinations={
        "dataset": {"type": "http", "url": api.url, "retry_initial_seconds": 0.2,
                    "retry_max_seconds": 1},
        "warehouse": {"type": "duckdb"},
    })  # fmt: skip
    _post(c, [{"seq": i} for i in range(30)], server=True)
    _seal(c)
    outage_ends = time.monotonic() + 15.0
    api.behaviour.unavailable_until = outage_ends
    done: list[Any] = []
    run = threading.Thread(target=lambda: done.append(process_once(c.config, spark)))
    run.start()
    loaded_at = None
    while run.is_alive() and loaded_at is None:
        try:
            if _query(c, "SELECT count(*) FROM events") == [(30,)]:
                loaded_at = time.monotonic()
        except (duckdb.Error, QueryError):  # not created yet, or held by the load
            time.sleep(0.2)
    run.join(120)
    assert loaded_at is not None
    assert loaded_at < outage_ends  # loaded during the outage
    [report] = done
    assert report.loaded[("dataset", "*sent*")] == 30
    assert sorted(e["attrs"]["seq"] for e in api.delivered) == list(range(30))


def test_events_reach_ga4_per_client_and_refused_ones_fail_with_ga4s_reason(
    start_collector: Any, spark: Any
) -> None:
    from tests.ga4 import ga4_server

    with ga4_server() as ga4:
        c = start_collector(destinations={
            "ga": {"type": "ga4", "measurement_id": ga4.measurement_id,
                   "api_secret": ga4.api_secret, "url": ga4.url,
                   "retry_initial_seconds": 0.1, "retry_max_seconds": 0.5},
        })  # fmt: skip
        events = [{"event_type": "page_view", "user": {"anonymous_id": f"c{i % 3}", "id": "u1"},
                   "page_location": f"https://shop.example/p/{i}", "seq": i}
                  for i in range(40)]  # fmt: skip
        events.append({"event_type": "purchase", "user": {"anonymous_id": "c0"},
                       "currency": "EURO", "value": 9.5})  # fmt: skip
        events.append({"event_type": "no_client", "seq": 99})
        _post(c, events)
        _seal(c)
        report = process_once(c.config, spark)
        assert report is not None
        assert report.loaded[("ga", "*sent*")] == 40
        assert report.failed["ga"] == 2
        received = ga4.events
        assert sorted(e["params"]["seq"] for e in received) == list(range(40))
        first = next(e for e in received if e["params"]["seq"] == 3)
        # The event's own fields only: not the collector's (the IP address, the key...).
        assert first["params"] == {"page_location": "https://shop.example/p/3", "seq": 3}
        assert (first["name"], first["client_id"], first["user_id"]) == ("page_view", "c0", "u1")
        assert first["timestamp_micros"] > 1_600_000_000 * 10**6  # _timestamp
        assert sorted(body["client_id"] for body in ga4.collected) == ["c0", "c1", "c2"]
        assert max(len(body["events"]) for body in ga4.collected) == 14  # c0: 0, 3, ... 39
        failed = {orjson.loads(x)["event"]["event_type"]: orjson.loads(x)["error"]
                  for x in c.layout.failed_destination("ga").read_bytes().splitlines()}  # fmt: skip
        assert "Currency [EURO] is not a valid ISO 4217 code" in failed["purchase"]
        assert "no GA4 client_id: the event's user_anonymous_id is empty" in failed["no_client"]
        written = [p.read_bytes() for p in c.layout.root.rglob("*") if p.is_file()]
        assert not any(ga4.api_secret.encode() in data for data in written)  # never on disk
