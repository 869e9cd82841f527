"""The collector fuzzed at the HTTP level: bodies, headers, content types, encodings and
chunking drawn by Hypothesis, over real HTTP. No answer is a 5xx, the process keeps
serving, and its memory stays bounded."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import httpx
import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import WEB_JS, WEB_SERVER, RunningCollector, make_config

EXAMPLES = int(os.environ.get("EVENTPIPE_HOSTILE_REQUESTS", "300"))
SOAK = "EVENTPIPE_HOSTILE_REQUESTS" in os.environ
ANSWERS = {200, 204, 400, 401, 403, 404, 405, 408, 413, 415, 431, 503}

JSONISH = [
    b"{}", b"[]", b'{"a":1}', b"[1,2,3]", b'{"a":', b'{"a":1}}', b"\xff\xfe", b"\x00",
    b'{"a":"\\ud800"}', b'{"a":NaN}', b"[" * 2000, b'{"":1,"":2}', b'{"a":1e999}',
    b'{"n":123456789012345678901234567890123456789012}', b'"text"', b"null", b"1",
    b'{"eventn_ctx":"x"}', b'{"source_ip":"fe80::1%x"}', b'[{"a":1},2,"x",null]',
]  # fmt: skip


def bodies() -> st.SearchStrategy[bytes]:
    mutated = st.tuples(st.sampled_from(JSONISH), st.binary(max_size=20)).map(
        lambda pair: pair[0] + pair[1]
    )
    return st.one_of(st.sampled_from(JSONISH), st.binary(max_size=300), mutated)


def header_values() -> st.SearchStrategy[str]:
    safe = st.characters(min_codepoint=0x20, max_codepoint=0x7E)
    return st.one_of(
        st.sampled_from(["application/json", "text/plain", "", "gzip", "deflate", "br",
                         "identity", "chunked", "application/json; charset=utf-16", "*/*"]),
        # httpx refuses to send a value with spaces around it: not the server's case
        st.text(alphabet=safe, max_size=40).map(str.strip),
    )  # fmt: skip


@pytest.fixture(scope="module")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningCollector]:
    config = make_config(tmp_path_factory.mktemp("fuzz") / "data",
                         server={"max_body_bytes": 4096, "body_timeout_seconds": 2})  # fmt: skip
    running = RunningCollector(config)
    yield running
    running.stop()


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=not SOAK,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
)
@given(
    path=st.sampled_from(
        [
            "/api/v1/event",
            "/api/v1/s2s/event",
            "/api/s/track",
            "/api/s/s2s/page",
            "/health",
            "/nowhere",
        ]
    ),
    method=st.sampled_from(["POST", "POST", "POST", "GET", "OPTIONS", "PUT"]),
    token=st.sampled_from([WEB_JS, WEB_SERVER, "", "wrong-token-xx", "x" * 5000]),
    headers=st.dictionaries(
        st.sampled_from(
            [
                "Content-Type",
                "Content-Encoding",
                "Origin",
                "X-Forwarded-For",
                "User-Agent",
                "X-Auth-Token",
                "X-Write-Key",
                "Accept",
            ]
        ),
        header_values(),
        max_size=4,
    ),
    body=bodies(),
    chunked=st.booleans(),
)
def test_no_request_gets_a_server_error(
    collector: RunningCollector,
    path: str,
    method: str,
    token: str,
    headers: dict[str, str],
    body: bytes,
    chunked: bool,
) -> None:
    content: Any = body
    if chunked:  # a generator: httpx sends it with Transfer-Encoding: chunked
        content = iter([body[: len(body) // 2], body[len(body) // 2 :]])
    response = httpx.request(method, collector.url + path, params={"token": token},
                             headers=headers, content=content, timeout=30)  # fmt: skip
    assert response.status_code in ANSWERS, (response.status_code, response.text[:300])
    if path.startswith("/api/") and method == "POST":
        assert response.headers["content-type"] == "application/json"
        answer = response.json()
        if path.startswith("/api/s/"):  # Jitsu 2's: the Segment API's answers
            assert answer["success"] is (response.status_code == 200), answer
        else:
            assert answer["status"] in ("ok", "partial", "error")


def test_the_collector_keeps_serving_with_bounded_memory(collector: RunningCollector) -> None:
    """After the fuzzing above (module order): still serving, memory within bounds."""
    ok = httpx.post(collector.url + "/api/v1/s2s/event", json={"a": 1},
                    headers={"X-Auth-Token": WEB_SERVER})  # fmt: skip
    assert ok.json() == {"status": "ok", "accepted": 1}
    before = psutil.Process().memory_info().rss
    for _ in range(200):  # the worst allowed body, 200 times
        httpx.post(collector.url + "/api/v1/s2s/event", content=b"[" + b"1," * 2040 + b"1]",
                   headers={"X-Auth-Token": WEB_SERVER})  # fmt: skip
    grown = psutil.Process().memory_info().rss - before
    assert grown < 50_000_000, f"memory grew {grown} bytes over 200 requests"
    assert httpx.get(collector.url + "/health").status_code == 200
