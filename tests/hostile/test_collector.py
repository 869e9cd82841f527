"""The collector against hostile clients: floods of bad items, slow clients, too many
connections, origins dressed up to match. Real HTTP on 127.0.0.1."""

from __future__ import annotations

import hashlib
import socket
import time
from typing import Any

import httpx
import orjson

from tests.conftest import SHOP_JS, WEB_JS, WEB_SERVER


def _failed_bytes(c: Any) -> int:
    return sum(p.stat().st_size for p in c.layout.failed.glob("*.log"))


def test_a_body_of_bad_items_costs_a_bounded_record_and_answer(start_collector: Any) -> None:
    c = start_collector(server={"max_events_per_request": 500_000})  # every item looked at
    body = b"[" + b",".join([b"1"] * 499_000) + b',{"ok":1}]'
    assert len(body) > 990_000
    response = httpx.post(c.url + "/api/v1/s2s/event", content=body,
                          headers={"X-Auth-Token": WEB_SERVER}, timeout=60)  # fmt: skip
    assert response.status_code == 200
    answer = response.json()
    assert answer["accepted"] == 1
    assert answer["rejected_count"] == 499_000
    assert len(answer["rejected"]) == 10
    assert len(response.content) < 4096
    # Ten records, one by one, and the body once (its first 4 KB, size and hash).
    lines = [orjson.loads(line) for p in c.layout.failed.glob("*.log")
             for line in p.read_bytes().splitlines()]  # fmt: skip
    assert len(lines) == 11
    summary = lines[-1]
    assert summary["raw_bytes"] == len(body)
    assert summary["raw_sha256"] == hashlib.sha256(body).hexdigest()
    assert summary["error"].startswith(
        "499000 items of the request rejected (499000 not_an_object)"
    )
    assert _failed_bytes(c) < 40_000  # against a 1 MB body
    metrics = httpx.get(c.url + "/metrics").text
    assert (
        'eventpipe_events_rejected_total{api_key="web",reason="not_an_object"} 499000.0' in metrics
    )
    # The collector goes on serving.
    ok = httpx.post(
        c.url + "/api/v1/s2s/event", json={"a": 1}, headers={"X-Auth-Token": WEB_SERVER}
    )
    assert ok.json() == {"status": "ok", "accepted": 1}


def test_an_oversized_event_is_recorded_cut_with_its_size_and_hash(start_collector: Any) -> None:
    c = start_collector(server={"max_event_bytes": 1024})
    event = {"big": "x" * 200_000}
    response = httpx.post(c.url + "/api/v1/s2s/event", json=[event, {"ok": 1}],
                          headers={"X-Auth-Token": WEB_SERVER})  # fmt: skip
    assert response.json()["accepted"] == 1
    [line] = [line for p in c.layout.failed.glob("*.log") for line in p.read_bytes().splitlines()]
    record = orjson.loads(line)
    assert record["event"] is None
    # The item as enriched (its source_ip, _timestamp...): its first 4 KB, size, hash.
    assert record["raw"].startswith('{"big":"xxxx')
    assert len(record["raw"]) == 4096
    assert record["raw_bytes"] > 200_000
    assert len(record["raw_sha256"]) == 64
    assert len(line) < 6_000


def _connect(c: Any) -> socket.socket:
    return socket.create_connection(("127.0.0.1", c.port), timeout=10)


def _answer(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_a_client_that_never_finishes_its_headers_is_closed(start_collector: Any) -> None:
    c = start_collector(server={"header_timeout_seconds": 0.5})
    with _connect(c) as silent, _connect(c) as slow:
        slow.sendall(b"POST /api/v1/s2s/event HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        started = time.monotonic()
        for sock in (silent, slow):
            answer = _answer(sock)  # the server closes: recv returns b""
            assert answer.startswith(b"HTTP/1.1 408 "), answer
            assert b"header_timeout_seconds" in answer
        assert time.monotonic() - started < 9  # closed by the timer, not by the client


def test_a_client_that_sends_less_body_than_announced_gets_408(start_collector: Any) -> None:
    c = start_collector(server={"body_timeout_seconds": 0.5})
    with _connect(c) as sock:
        head = b"POST /api/v1/s2s/event HTTP/1.1\r\nHost: x\r\nContent-Length: 900000\r\n"
        sock.sendall(head + b"X-Auth-Token: " + WEB_SERVER.encode() + b'\r\n\r\n{"a":')
        answer = _answer(sock)
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert b"body_timeout_seconds" in answer
    assert list(c.layout.failed.glob("*.log")) == []  # nothing was an event


def test_past_max_connections_new_requests_get_503(start_collector: Any) -> None:
    c = start_collector(server={"max_connections": 2})
    held = [_connect(c), _connect(c)]
    try:
        with httpx.Client() as client:
            response = client.post(c.url + "/api/v1/s2s/event", json={"a": 1},
                                   headers={"X-Auth-Token": WEB_SERVER})  # fmt: skip
        assert response.status_code == 503
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.2)  # the server notices the closed connections
    response = httpx.post(c.url + "/api/v1/s2s/event", json={"a": 1},
                          headers={"X-Auth-Token": WEB_SERVER})  # fmt: skip
    assert response.status_code == 200


def test_origins_that_only_look_like_allowed_ones_are_refused(start_collector: Any) -> None:
    c = start_collector()  # shop: https://shop.example.com, https://*.example.org
    for origin in ("https://evil.com/.example.org", "https://evil.com#.example.org",
                   "https://user@a.example.org", "https://a.example.org:8443", "null"):  # fmt: skip
        response = httpx.post(c.url + "/api/v1/event", json={"a": 1},
                              params={"token": SHOP_JS}, headers={"Origin": origin})  # fmt: skip
        assert response.status_code == 403, origin
    allowed = httpx.post(c.url + "/api/v1/event", json={"a": 1}, params={"token": SHOP_JS},
                         headers={"Origin": "https://a.example.org"})  # fmt: skip
    assert allowed.status_code == 200
    assert WEB_JS  # the web key allows any origin: not what this test is about


def test_failed_records_count_toward_the_backlog(start_collector: Any) -> None:
    c = start_collector(incoming={"max_backlog_bytes": 50_000})
    c.layout.failed.mkdir(parents=True, exist_ok=True)
    (c.layout.failed / "failed.tok=web.log").write_bytes(b"x" * 60_000)
    c.collector.backpressure.refresh()
    response = httpx.post(c.url + "/api/v1/s2s/event", json={"a": 1},
                          headers={"X-Auth-Token": WEB_SERVER})  # fmt: skip
    assert response.status_code == 503
    assert "max_backlog_bytes" in response.json()["error"]


def test_a_request_of_many_empty_objects_stores_a_bounded_number_of_events(
    start_collector: Any,
) -> None:
    """Each event costs some 150 bytes of enrichment whatever its size: 300,000 ``{}``
    from the public key made 55 MB of log. Past max_events_per_request, items are
    refused, counted, and the body recorded once."""
    c = start_collector()
    body = b"[" + b",".join([b"{}"] * 300_000) + b"]"
    answer = httpx.post(c.url + "/api/v1/event", params={"token": WEB_JS}, content=body,
                        timeout=60)  # fmt: skip
    found = answer.json()
    assert (answer.status_code, found["accepted"], found["rejected_count"]) == (
        200,
        10_000,
        290_000,
    )
    past = "items 10000 to 299999 are past max_events_per_request (10000)"
    assert found["rejected"] == [
        {"index": 10_000, "error": f"{past}: send them in another request"}
    ]
    segment = httpx.post(c.url + "/v1/batch", timeout=60, json={"writeKey": WEB_JS, "batch":
                         [{"type": "track", "event": "e", "userId": "u"}] * 10_001})  # fmt: skip
    assert (segment.json()["accepted"], segment.json()["rejected_count"]) == (10_000, 1)
    logged = sum(p.stat().st_size for p in c.layout.active_segments())
    assert logged < 20_000 * 400  # 20,000 events, a few hundred bytes each
    assert _failed_bytes(c) < 20_000
    metrics = httpx.get(c.url + "/metrics").text
    assert (
        'eventpipe_events_rejected_total{api_key="web",reason="too_many_events"} 290001.0'
        in metrics
    )


def test_a_request_that_would_store_far_more_than_it_sent_is_refused(
    start_collector: Any,
) -> None:
    """Every browser event gets a copy of the User-Agent: 10,000 ``{}`` under a 40 KB
    User-Agent would store 400 MB from 70 KB. Past server.max_amplification the request is
    refused whole with 413 and nothing is stored; a browser's ordinary batch is not."""
    c = start_collector()
    body = b"[" + b",".join([b"{}"] * 10_000) + b"]"
    huge = {"User-Agent": "Mozilla/5.0 " + "x" * 40_000}
    for path, content in (
        ("/api/v1/event", body),
        (
            "/v1/batch",
            orjson.dumps(
                {
                    "writeKey": WEB_JS,
                    "batch": [{"type": "track", "event": "e", "userId": "u"}] * 2_000,
                }
            ),
        ),
    ):
        answer = httpx.post(c.url + path, params={"token": WEB_JS}, content=content,
                            headers=huge, timeout=60)  # fmt: skip
        assert answer.status_code == 413, answer.text
        assert "past server.max_amplification (100x" in answer.json()["error"]
    assert sum(p.stat().st_size for p in c.layout.active_segments()) == 0
    assert _failed_bytes(c) == 0
    ordinary = [{"event_type": "click", "n": n} for n in range(500)]
    answer = httpx.post(c.url + "/api/v1/event", params={"token": WEB_JS}, json=ordinary,
                        headers={"User-Agent": "Mozilla/5.0 " + "x" * 400})  # fmt: skip
    assert (answer.status_code, answer.json()["accepted"]) == (200, 500)
    metrics = httpx.get(c.url + "/metrics").text
    assert 'eventpipe_events_rejected_total{api_key="web",reason="amplification"} 12000.0' in (
        metrics
    )


def test_a_bulk_upload_stops_at_its_event_cap_keeping_what_came_before(
    start_collector: Any,
) -> None:
    c = start_collector(server={"max_bulk_events": 5})
    body = b"".join(orjson.dumps({"n": n}) + b"\n" for n in range(10))
    answer = httpx.post(c.url + "/api/v1/s2s/bulk", content=body,
                        headers={"X-Auth-Token": WEB_SERVER})  # fmt: skip
    assert answer.status_code == 413
    found = answer.json()
    assert found["accepted"] == 5
    assert found["error"] == "line 6 is past max_bulk_events (5): the lines before it are kept"
