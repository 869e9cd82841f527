"""The collector over real HTTP on 127.0.0.1: endpoints, keys, origins, CORS, enrichment."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import orjson
import pytest

from tests.conftest import SHOP_JS, WEB_JS, WEB_SERVER, RunningCollector, read_lines

BROWSER = "/api/v1/event"
SERVER = "/api/v1/s2s/event"


def _active_events(c: RunningCollector, key: str = "web") -> list[dict[str, Any]]:
    path = c.layout.active_segment(key, c.writer)
    return read_lines([path]) if path.exists() else []


def _post(c: RunningCollector, path: str, body: Any, **kwargs: Any) -> httpx.Response:
    content = body if isinstance(body, bytes) else orjson.dumps(body)
    return httpx.post(c.url + path, content=content, **kwargs)


def test_browser_event_is_durable_and_enriched_exactly(start_collector: Any) -> None:
    c = start_collector()
    response = _post(
        c,
        BROWSER,
        {"event_type": "page", "user": {"id": 7}},
        params={"token": WEB_JS},
        headers={"User-Agent": "Mozilla/5.0 (X11) Test"},
    )
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "accepted": 1}
    [event] = _active_events(c)  # on disk as soon as the 200 is back
    assert set(event) == {"event_type", "user", "eventn_ctx", "source_ip", "_timestamp", "api_key"}
    assert event["user"] == {"id": 7}
    assert event["source_ip"] == "127.0.0.1"
    assert event["api_key"] == "web"
    assert event["_timestamp"].endswith("Z")
    assert event["eventn_ctx"]["user_agent"] == "Mozilla/5.0 (X11) Test"
    assert uuid.UUID(event["eventn_ctx"]["event_id"]).version == 7
    assert WEB_JS not in c.layout.active_segment("web", c.writer).read_text()


def test_server_event_with_header_key(start_collector: Any) -> None:
    c = start_collector()
    response = _post(
        c,
        SERVER,
        [{"event_type": "order", "messageId": "m-1", "source_ip": "198.51.100.4"}],
        headers={"X-Auth-Token": WEB_SERVER},
    )
    assert response.status_code == 200
    [event] = _active_events(c)
    assert event["src"] == "api"
    assert event["eventn_ctx"] == {"event_id": "m-1"}
    assert event["source_ip"] == "198.51.100.4"


def test_browser_key_by_header_too(start_collector: Any) -> None:
    c = start_collector()
    assert _post(c, BROWSER, {"a": 1}, headers={"X-Auth-Token": WEB_JS}).status_code == 200


@pytest.mark.parametrize(
    ("path", "token", "status", "message"),
    [
        (BROWSER, None, 401, "missing or unknown API key"),
        (BROWSER, "wrong-token-123", 401, "missing or unknown API key"),
        (SERVER, None, 401, "missing or unknown API key"),
        (SERVER, WEB_JS, 403, "takes server keys only (post to /api/v1/event)"),
        (BROWSER, WEB_SERVER, 403, "takes js keys only (post to /api/v1/s2s/event)"),
    ],
)
def test_keys_are_checked_per_endpoint(
    start_collector: Any, path: str, token: str | None, status: int, message: str
) -> None:
    c = start_collector()
    params = {"token": token} if token else {}
    response = _post(c, path, {"a": 1}, params=params)
    assert response.status_code == status
    assert message in response.json()["error"]
    assert _active_events(c) == []


@pytest.mark.parametrize(
    ("origin", "status"),
    [
        ("https://shop.example.com", 200),
        ("https://eu.example.org", 200),
        ("https://evil.example.com", 403),
        ("http://shop.example.com", 403),
        (None, 403),
    ],
)
def test_origins_of_a_restricted_key(start_collector: Any, origin: str | None, status: int) -> None:
    c = start_collector()
    headers = {"Origin": origin} if origin else {}
    response = _post(c, BROWSER, {"a": 1}, params={"token": SHOP_JS}, headers=headers)
    assert response.status_code == status
    if status == 200:
        assert response.headers["access-control-allow-origin"] == origin
        assert response.headers["vary"] == "Origin"
        assert len(_active_events(c, "shop")) == 1
    else:
        assert "not allowed for key 'shop'" in response.json()["error"]
        assert _active_events(c, "shop") == []


def test_an_unrestricted_key_answers_any_origin_with_cors_headers(start_collector: Any) -> None:
    c = start_collector()
    response = _post(
        c, BROWSER, {"a": 1}, params={"token": WEB_JS}, headers={"Origin": "https://any.test"}
    )
    assert response.status_code == 200
    assert response.headers["access-control-allow-origin"] == "https://any.test"


def _preflight(c: RunningCollector, origin: str | None, token: str | None = None) -> httpx.Response:
    headers = {"Access-Control-Request-Method": "POST"}
    if origin:
        headers["Origin"] = origin
    params = {"token": token} if token else {}
    return httpx.options(c.url + BROWSER, headers=headers, params=params)


def test_cors_preflight(start_collector: Any) -> None:
    c = start_collector(server={"cors_max_age_seconds": 600})
    allowed = _preflight(c, "https://shop.example.com", SHOP_JS)
    assert allowed.status_code == 204
    assert allowed.headers["access-control-allow-origin"] == "https://shop.example.com"
    assert "POST" in allowed.headers["access-control-allow-methods"]
    assert "X-Auth-Token" in allowed.headers["access-control-allow-headers"]
    assert allowed.headers["access-control-max-age"] == "600"
    refused = _preflight(c, "https://evil.test", SHOP_JS)
    assert refused.status_code == 403
    assert "access-control-allow-origin" not in refused.headers
    # token in a header (not visible to the preflight): any js key allowing the origin
    assert _preflight(c, "https://evil.test").status_code == 204  # `web` allows any origin
    assert _preflight(c, None).status_code == 400


def test_preflight_without_a_permissive_key(start_collector: Any) -> None:
    c = start_collector(
        api_keys=[{"id": "shop", "js": SHOP_JS, "origins": ["https://shop.example.com"]}]
    )
    assert _preflight(c, "https://shop.example.com").status_code == 204
    assert _preflight(c, "https://evil.test").status_code == 403


def test_a_preflight_allows_the_headers_sdks_send(start_collector: Any) -> None:
    """RudderStack's browser SDK sends AnonymousId, SentAt and its RSA-Retry-* headers;
    analytics-next adds X-Retry-Count on retries: a preflight that refused them blocked
    every request (RudderStack) or every retry (Segment)."""
    c = start_collector()
    asked = "anonymousid, sentat, rsa-retry-attempt, rsa-retry-reason, x-retry-count, a b"
    for path in (BROWSER, "/v1/batch"):
        answer = httpx.options(c.url + path, headers={
            "Origin": "https://shop.example.com", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": asked})  # fmt: skip
        assert answer.status_code == 204
        allowed = [h.strip() for h in answer.headers["access-control-allow-headers"].split(",")]
        assert {"anonymousid", "sentat", "rsa-retry-attempt", "x-retry-count"} <= set(allowed)
        assert "X-Auth-Token" in allowed
        assert "a b" not in allowed  # not a header name: not echoed
        assert answer.headers["access-control-allow-credentials"] == "true"
        assert answer.headers["access-control-allow-origin"] == "https://shop.example.com"


def test_error_answers_to_an_allowed_origin_carry_cors_and_the_codes_sdks_read(
    start_collector: Any,
) -> None:
    """A 401 without CORS headers is a network error to the page, which SDKs retry;
    rudder-sdk-python raised KeyError('code') on a 4xx body without one."""
    c = start_collector()
    origin = {"Origin": "https://any.test"}  # `web` allows any origin
    unknown = httpx.post(c.url + BROWSER, params={"token": "nope"}, json={}, headers=origin)
    assert unknown.status_code == 401
    assert unknown.headers["access-control-allow-origin"] == "https://any.test"
    assert unknown.json()["code"] == "unauthorized"
    segment = httpx.post(c.url + "/v1/track", json={"writeKey": "nope"}, headers=origin)
    assert segment.status_code == 401
    assert segment.headers["access-control-allow-origin"] == "https://any.test"
    assert (segment.json()["code"], segment.json()["success"]) == ("unauthorized", False)
    assert "write key" in segment.json()["message"]
    bad = httpx.post(c.url + "/v1/batch", content=b"{", headers=origin)
    assert bad.status_code == 400
    assert bad.headers["access-control-allow-origin"] == "https://any.test"
    assert bad.json()["code"] == "malformed_json"
    invalid = httpx.post(c.url + "/v1/track", headers=origin,
                         json={"writeKey": WEB_JS, "type": "track", "userId": "u"})  # fmt: skip
    assert invalid.status_code == 400  # no event name: nothing taken
    assert (invalid.json()["code"], invalid.json()["message"]) == (
        "rejected", "a track message needs event")  # fmt: skip
    assert invalid.headers["x-eventpipe-rejected"] == "1"
    # An origin no browser key allows gets no CORS headers, errors included.
    c2 = start_collector(data_dir=c.config.data_dir.parent / "restricted", api_keys=[
        {"id": "shop", "js": SHOP_JS, "origins": ["https://shop.example.com"]}])  # fmt: skip
    other = httpx.post(c2.url + "/v1/track", json={"writeKey": "nope"}, headers=origin)
    assert other.status_code == 401
    assert "access-control-allow-origin" not in other.headers


def test_a_partly_refused_batch_says_so_in_a_header(start_collector: Any) -> None:
    c = start_collector()
    answer = _post(c, BROWSER, [{"a": 1}, 5], params={"token": WEB_JS},
                   headers={"Origin": "https://any.test"})  # fmt: skip
    assert answer.status_code == 200
    assert answer.json()["status"] == "partial"
    assert answer.headers["x-eventpipe-rejected"] == "1"
    assert "X-Eventpipe-Rejected" in answer.headers["access-control-expose-headers"]


def test_x_forwarded_for_from_a_trusted_proxy(start_collector: Any) -> None:
    c = start_collector(server={"trusted_proxies": ["127.0.0.0/8"]})
    _post(
        c,
        BROWSER,
        {"a": 1},
        params={"token": WEB_JS},
        headers={"X-Forwarded-For": "6.6.6.6, 203.0.113.9"},
    )
    untrusted = start_collector(data_dir=c.config.data_dir.parent / "other")
    _post(
        untrusted,
        BROWSER,
        {"a": 1},
        params={"token": WEB_JS},
        headers={"X-Forwarded-For": "203.0.113.9"},
    )
    assert _active_events(c)[0]["source_ip"] == "203.0.113.9"
    assert _active_events(untrusted)[0]["source_ip"] == "127.0.0.1"


def test_ip_anonymisation_happens_before_writing(start_collector: Any) -> None:
    c = start_collector(server={"anonymize_ip": True})
    _post(c, BROWSER, {"a": 1}, params={"token": WEB_JS})
    _post(c, SERVER, {"source_ip": "198.51.100.77"}, headers={"X-Auth-Token": WEB_SERVER})
    events = _active_events(c)
    assert [e["source_ip"] for e in events] == ["127.0.0.0", "198.51.100.0"]
    assert b"198.51.100.77" not in c.layout.active_segment("web", c.writer).read_bytes()


def test_health_and_metrics(start_collector: Any) -> None:
    c = start_collector()
    assert httpx.get(c.url + "/health").json() == {"status": "ok"}
    _post(c, BROWSER, [{"a": 1}, {"a": 2}, 3], params={"token": WEB_JS})
    _post(c, BROWSER, b"{oops", params={"token": WEB_JS})
    _post(c, BROWSER, {"a": 1}, params={"token": "nope-nope"})
    metrics = httpx.get(c.url + "/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")
    text = metrics.text
    for line in [
        'eventpipe_events_accepted_total{api_key="web"} 2.0',
        'eventpipe_events_rejected_total{api_key="web",reason="not_an_object"} 1.0',
        'eventpipe_events_rejected_total{api_key="web",reason="malformed_json"} 1.0',
        'eventpipe_events_rejected_total{api_key="-",reason="unauthorized"} 1.0',
        'eventpipe_http_requests_total{endpoint="event",status="200"} 1.0',
        'eventpipe_http_requests_total{endpoint="event",status="400"} 1.0',
        'eventpipe_http_requests_total{endpoint="event",status="401"} 1.0',
    ]:
        assert line in text, line
    # Where a group-commit round's time goes: its syncs, its wait (the hand-off
    # included), and how many appends each round carried.
    series = dict(line.rsplit(" ", 1) for line in text.splitlines() if line[:1] != "#")
    rounds = float(series["eventpipe_log_fsync_seconds_count"])
    assert rounds >= 1
    assert float(series["eventpipe_log_round_wait_seconds_count"]) == rounds
    assert float(series["eventpipe_log_round_wait_seconds_sum"]) >= float(
        series["eventpipe_log_fsync_seconds_sum"]
    )
    assert float(series["eventpipe_log_round_appends_total"]) >= rounds
    assert "eventpipe_backlog_bytes" in text
    assert "_created" not in text


def test_wrong_methods_and_paths(start_collector: Any) -> None:
    c = start_collector()
    assert httpx.get(c.url + BROWSER).status_code == 405
    assert httpx.post(c.url + "/api/v2/event", content=b"{}").status_code == 404


def test_rotation_by_size_and_age_over_http(start_collector: Any) -> None:
    import time

    c = start_collector(incoming={"max_segment_bytes": 2048, "rotate_seconds": 0.5})
    for i in range(20):
        assert _post(c, BROWSER, {"i": i, "pad": "x" * 200}, params={"token": WEB_JS}).is_success
    by_size = c.layout.sealed_segments()
    assert len(by_size) >= 2
    deadline = time.monotonic() + 5
    while c.layout.active_segments() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert c.layout.active_segments() == []  # the rest sealed by age
    events = read_lines(c.layout.sealed_segments())
    assert [e["i"] for e in events] == list(range(20))


def test_stopping_seals_and_releases_the_directory(start_collector: Any) -> None:
    c = start_collector()
    _post(c, BROWSER, {"a": 1}, params={"token": WEB_JS})
    c.stop()
    assert c.layout.active_segments() == []
    assert len(read_lines(c.layout.sealed_segments())) == 1
    again = start_collector(data_dir=c.config.data_dir)  # the lock was released
    assert httpx.get(again.url + "/health").status_code == 200


class _CountedWrites:
    """The socket's transport, counting the writes that reach it."""

    def __init__(self, transport: Any, writes: list[bytes]) -> None:
        self._transport = transport
        self.writes = writes

    def write(self, data: bytes) -> None:
        self.writes.append(data)
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def test_each_answer_leaves_in_one_write(start_collector: Any, monkeypatch: Any) -> None:
    """A response's head and body reach the socket together: a collector killed between
    two writes would leave a 200 head without its body, which an SDK takes as a failed
    batch it must not retry (tests/e2e/test_segment.py kills it while SDKs send)."""
    from eventpipe.collector.protocol import LimitedHttpToolsProtocol

    writes: list[bytes] = []
    made = LimitedHttpToolsProtocol.connection_made

    def counted(self: Any, transport: Any) -> None:
        made(self, _CountedWrites(transport, writes))

    monkeypatch.setattr(LimitedHttpToolsProtocol, "connection_made", counted)
    c = start_collector()
    track = {"event": "Tick", "userId": "u1"}
    with httpx.Client(base_url=c.url, params={"token": WEB_JS}) as client:  # one connection
        answers = [
            client.post(BROWSER, content=b'{"event_type": "page"}'),
            client.post(BROWSER, content=b'[{"a": 1}, {"a": 2}]'),
            client.post(BROWSER, content=b'{"a": 1'),  # malformed: 400
            client.post("/v1/track", json=track, auth=(WEB_SERVER, "")),
            client.get("/health"),  # through the router
        ]
    assert [a.status_code for a in answers] == [200, 200, 400, 200, 200]
    assert len(writes) == len(answers)
    for write, answer in zip(writes, answers, strict=True):
        assert write.startswith(b"HTTP/1.1 ")
        assert write.endswith(answer.content)
