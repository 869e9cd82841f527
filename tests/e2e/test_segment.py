"""The Segment API with the real SDKs (``segment-analytics-python``, ``rudder-sdk-python``,
pinned in the dev dependencies), and by hand: what they send lands in the warehouse as
sent, an SDK's retry after the collector died is one row, the pixel answers a GIF.
"""

from __future__ import annotations

import base64
import gzip
import random
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import orjson
import pytest

from eventpipe.processing.batch.job import process_once
from tests.conftest import WEB_JS, WEB_SERVER, RunningCollector, read_lines
from tests.e2e.test_batch_pipeline import _query, _seal
from tests.process import CollectorProcess, free_port, write_config

SDKS = Path(__file__).resolve().parents[1] / "sdk"
WAREHOUSE = {"warehouse": {"type": "duckdb", "table_name_template": "{{ type }}",
                           "primary_key": ["eventn_ctx_event_id"]}}  # fmt: skip


def _send_everything(client: Any) -> None:
    """One message of each type, as a tracking plan would."""
    client.identify("u1", {"email": "ada@example.com", "plan": "pro"})
    client.track("u1", "Order Completed", {"revenue": 42.5, "currency": "EUR"})
    client.page("u1", "Docs", "Install", {"url": "https://example.com/docs"})
    client.screen("u1", "App", "Home", {"tab": 2})
    client.group("u1", "g1", {"name": "Acme"})
    client.alias("anon-1", "u1")
    client.flush()


@pytest.mark.parametrize("sdk", ["segment", "rudderstack"])
def test_an_sdk_pointed_at_the_collector_loads_every_type(
    sdk: str, start_collector: Any, spark: Any
) -> None:
    c = start_collector(destinations=WAREHOUSE)
    if sdk == "segment":
        from segment.analytics import Client
    else:
        from rudderstack.analytics import Client  # type: ignore[no-redef]
    errors: list[Any] = []
    client = Client(WEB_SERVER, host=c.url, sync_mode=True, max_retries=1,
                    on_error=lambda error, items: errors.append(error))  # fmt: skip
    _send_everything(client)
    assert errors == []
    _check_warehouse(c, spark, "analytics-python", rudder=sdk == "rudderstack")


@pytest.mark.parametrize("sdk", ["segment", "rudderstack"])
def test_a_node_sdk_pointed_at_the_collector_loads_every_type(
    sdk: str, start_collector: Any, spark: Any
) -> None:
    """@segment/analytics-node 3.1.0 and @rudderstack/rudder-sdk-node 3.0.13 (gzip by
    default), pinned in tests/sdk/package.json, installed by make test (npm ci)."""
    c = start_collector(destinations=WAREHOUSE)
    assert (SDKS / "node_modules").is_dir(), "the Node SDKs are not installed: run make test"
    sent = subprocess.run(["node", str(SDKS / "send.mjs"), sdk, c.url, WEB_SERVER],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert sent.returncode == 0, sent.stderr[-2000:]
    library = "@segment/analytics-node" if sdk == "segment" else "analytics-node"
    _check_warehouse(c, spark, library, rudder=sdk == "rudderstack")


def test_jitsu_2s_node_sdk_sends_with_its_server_key(start_collector: Any, spark: Any) -> None:
    """@jitsu/js 1.11.0 (Jitsu 2) in Node with ``s2s: true``: ``/api/s/s2s/<type>``,
    the key as ``X-Write-Key: id:secret``; every call one row, typed as sent."""
    c = start_collector(destinations=WAREHOUSE)
    sent = subprocess.run(["node", str(SDKS / "send.mjs"), "jitsu", c.url, f"web:{WEB_SERVER}"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert sent.returncode == 0, sent.stdout[-2000:] + sent.stderr[-2000:]
    _seal(c)
    report = process_once(c.config, spark)
    assert report is not None
    assert sum(report.failed.values()) == 0
    loaded = {table: rows for (_, table), rows in report.loaded.items()}
    assert loaded == {"identify": 1, "track": 1, "page": 1, "group": 1}
    [(event, revenue, key, library)] = _query(c, "SELECT event, properties_revenue, api_key, "
                                              "context_library_name FROM track")  # fmt: skip
    assert (event, revenue, key, library) == ("Order Completed", 42.5, "web", "@jitsu/js")
    columns = {name for (name,) in _query(c, "SELECT column_name FROM "
               "information_schema.columns WHERE table_name = 'track'")}  # fmt: skip
    assert "writeKey" not in columns  # the SDK's masked "web:***", dropped as any writeKey
    [(email,)] = _query(c, "SELECT traits_email FROM identify")
    assert email == "ada@example.com"


def test_jitsu_2_paths_take_keys_of_their_kind_only(start_collector: Any) -> None:
    """A browser key cannot send as a server (its context.ip would be believed); the id
    in ``id:secret`` must be the secret's own key; each refusal says what to do."""
    c = start_collector()
    message = {"type": "track", "event": "Signed Up", "anonymousId": "a1"}
    cases = [
        ("/api/s/s2s/track", f"web:{WEB_JS}", 403, "post to /api/s/<type>"),
        ("/api/s/track", f"web:{WEB_SERVER}", 403, "s2s: true"),
        ("/api/s/s2s/track", f"other:{WEB_SERVER}", 401, "X-Write-Key: ID:SECRET"),
        ("/api/s/s2s/track", None, 401, "X-Write-Key: ID:SECRET"),
        ("/api/s/s2s/checkout", f"web:{WEB_SERVER}", 404, "one of track"),
    ]
    for path, key, status, hint in cases:
        headers = {"X-Write-Key": key} if key else {}
        answer = httpx.post(c.url + path, json=message, headers=headers)
        assert (path, key, answer.status_code) == (path, key, status)
        assert hint in answer.json()["message" if status != 404 else "error"]
    assert sum(len(p.read_bytes().splitlines()) for p in c.layout.active_segments()) == 0
    for path, key in [("/api/s/s2s/track", f"web:{WEB_SERVER}"), ("/api/s/track", WEB_JS)]:
        answer = httpx.post(c.url + path, json=message, headers={"X-Write-Key": key})
        assert answer.status_code == 200, answer.text
    events = read_lines(c.layout.active_segments())
    assert [e["event_type"] for e in events] == ["Signed Up", "Signed Up"]


def _check_warehouse(c: RunningCollector, spark: Any, library: str, *, rudder: bool) -> None:
    """The six messages of _send_everything, one row each, as sent."""
    _seal(c)
    report = process_once(c.config, spark)
    assert report is not None
    assert sum(report.failed.values()) == 0
    loaded = {table: rows for (_, table), rows in report.loaded.items()}
    assert loaded == {t: 1 for t in ("identify", "track", "page", "screen", "group", "alias")}
    [(event, revenue, currency, src, key)] = _query(
        c, "SELECT event, properties_revenue, properties_currency, src, api_key FROM track"
    )
    assert (event, revenue, currency, src, key) == (
        "Order Completed",
        42.5,
        "EUR",
        "segment",
        "web",
    )
    traits = "context_traits" if rudder else "traits"  # where each SDK puts them
    [(email, plan)] = _query(c, f"SELECT {traits}_email, {traits}_plan FROM identify")
    assert (email, plan) == ("ada@example.com", "pro")
    [(name, category)] = _query(c, "SELECT name, category FROM page")
    assert (name, category) == ("Install", "Docs")
    [(previous, user)] = _query(c, 'SELECT "previousId", "userId" FROM alias')
    assert (previous, user) == ("anon-1", "u1")
    # The SDK's messageId is the event id; its library is in the context.
    [(event_id, message_id, found)] = _query(
        c, 'SELECT eventn_ctx_event_id, "messageId", context_library_name FROM "group"'
    )
    assert event_id == message_id
    assert found == library


@pytest.mark.timeout(600)  # a loaded machine restarts the collector slowly
@pytest.mark.parametrize("sdk", ["python", "node-segment", "node-rudderstack"])
def test_an_sdk_retry_after_the_collector_died_is_one_row(
    sdk: str, tmp_path: Path, spark: Any
) -> None:
    """The collector is killed with SIGKILL at random moments while the SDK sends 3,000
    tracks (and started again): the SDK retries what got no answer, and what was logged
    twice (fsynced, then killed before the answer) is one row by its messageId.

    The kills stop after the sending: an SDK gives up on a batch after its retries or its
    flush timeout (analytics-node's closeAndFlush drops what is left, silently), so a
    collector that never stays up loses events in any pipeline."""
    port = free_port()
    config = write_config(tmp_path / "eventpipe.yaml", tmp_path / "data", port,
                          destinations=WAREHOUSE)  # fmt: skip
    log_path = tmp_path / "collector.log"
    running = [CollectorProcess(config, port, log_path)]
    running[0].wait_ready()
    sending = threading.Event()
    sending.set()

    def killer() -> None:
        rng = random.Random(3)
        while sending.is_set():
            time.sleep(rng.uniform(0.2, 0.6))
            running[-1].kill()
            running.append(CollectorProcess(config, port, log_path))
            running[-1].wait_ready()

    thread = threading.Thread(target=killer)
    thread.start()
    try:
        if sdk == "python":
            _send_ticks_from_python(port, sending)
        else:
            _send_ticks_from_node(sdk.removeprefix("node-"), port, sending)
    finally:
        sending.clear()
        thread.join()
        running[-1].signal(signal.SIGTERM)
        running[-1].wait()
    assert len(running) >= 3, "the collector was not killed while the SDK sent"
    from eventpipe.config import load_config

    loaded = load_config(config).config
    process_once(loaded, spark)
    rows = _query_config(loaded, "SELECT count(*), count(DISTINCT properties_n) FROM track")
    assert rows == [(TICKS, TICKS)]


TICKS = 3000


def _send_ticks_from_python(port: int, sending: threading.Event) -> None:
    from segment.analytics import Client

    errors: list[Any] = []
    client = Client(WEB_SERVER, host=f"http://127.0.0.1:{port}", max_retries=20,
                    upload_size=50, on_error=lambda error, items: errors.append(error))  # fmt: skip
    for n in range(TICKS):  # over about 5 s: several kills while the SDK sends
        client.track(f"u{n % 7}", "Tick", {"n": n})
        time.sleep(0.0015)
    time.sleep(1.0)  # and while its queue drains
    sending.clear()
    client.flush()
    client.join()
    assert errors == []


def _send_ticks_from_node(sdk: str, port: int, sending: threading.Event) -> None:
    """send.mjs sends its ticks over about 5 s; the kills stop 3 s later, while it drains."""
    node = subprocess.Popen(["node", str(SDKS / "send.mjs"), sdk, f"http://127.0.0.1:{port}",
                             WEB_SERVER, str(TICKS)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        time.sleep(8.0)
        sending.clear()
        out, err = node.communicate(timeout=300)
    finally:
        node.kill()
    assert node.returncode == 0, err[-2000:]
    assert f"sent {TICKS} messages" in out


def _query_config(config: Any, sql: str) -> list[tuple[Any, ...]]:
    from eventpipe.destinations.duckdb import DuckDBDestination
    from eventpipe.locks import FileLocks

    warehouse = DuckDBDestination("warehouse", config.layout.warehouse,
                                  FileLocks(config.layout.locks))  # fmt: skip
    return warehouse.query(sql)[1]


def _basic(key: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{key}:".encode()).decode()}


def test_the_api_answers_as_the_sdks_expect(start_collector: Any) -> None:
    c: RunningCollector = start_collector()
    message = {"userId": "u", "event": "E", "properties": {"a": 1}}
    ok = httpx.post(c.url + "/v1/track", json=message, headers=_basic(WEB_SERVER))
    assert (ok.status_code, ok.json()) == (200, {"success": True, "accepted": 1})
    # gzip, as rudder-sdk-python sends by default
    zipped = gzip.compress(orjson.dumps({"batch": [{**message, "type": "track"}] * 3}))
    answer = httpx.post(c.url + "/v1/batch", content=zipped,
                        headers={**_basic(WEB_SERVER), "Content-Encoding": "gzip"})  # fmt: skip
    assert answer.json()["accepted"] == 3
    # 4xx is not retried by the SDKs: what can never be stored
    unknown = httpx.post(c.url + "/v1/track", json=message, headers=_basic("nope"))
    assert unknown.status_code == 401
    assert "write key" in unknown.json()["error"]
    nobody = httpx.post(c.url + "/v1/track", json={"event": "E"}, headers=_basic(WEB_SERVER))
    assert nobody.status_code == 400
    assert nobody.json()["rejected"][0]["error"] == "a message needs userId or anonymousId"
    mixed = {"batch": [{**message, "type": "track"}, {"type": "track", "userId": "u"}]}
    partly = httpx.post(c.url + "/v1/batch", json=mixed, headers=_basic(WEB_SERVER))
    assert partly.status_code == 200
    assert partly.json()["rejected"] == [{"index": 1, "error": "a track message needs event"}]
    missing = httpx.post(c.url + "/v1/launch", json=message, headers=_basic(WEB_SERVER))
    assert missing.status_code == 404
    # A gzip bomb: 50 MB of zeros in 50 KB, refused past max_body_bytes.
    bomb = gzip.compress(b"0" * 50_000_000)
    refused = httpx.post(c.url + "/v1/batch", content=bomb,
                         headers={**_basic(WEB_SERVER), "Content-Encoding": "gzip"})  # fmt: skip
    assert refused.status_code == 413
    # The write key in the body (analytics.js): the browser key, checked as a browser's.
    browser = httpx.post(c.url + "/v1/t", content=orjson.dumps({**message, "writeKey": WEB_JS}),
                         headers={"Content-Type": "text/plain",
                                  "Origin": "https://a.example"})  # fmt: skip
    assert browser.status_code == 200
    assert browser.headers["access-control-allow-origin"] == "https://a.example"
    _seal(c)
    failed = read_lines(c.layout.failed_received("web"))
    assert {line["error"] for line in failed} == {
        "item 0: a message needs userId or anonymousId",
        "item 1: a track message needs event",
    }
    logged = read_lines(c.layout.sealed_segments())
    assert len(logged) == 6
    assert all("writeKey" not in event for event in logged)  # the secret is never stored


def test_the_pixel_answers_a_gif_that_is_never_cached(start_collector: Any, tmp_path: Path) -> None:
    c: RunningCollector = start_collector()
    data = base64.b64encode(orjson.dumps(
        {"writeKey": WEB_JS, "userId": "reader", "event": "Email Opened",
         "properties": {"campaign": "nov"}})).decode()  # fmt: skip
    # curl, as a mail client fetches an image: a plain GET, no Origin, no cookies
    fetched = subprocess.run(["curl", "-s", "-D", "-", "-o", str(tmp_path / "pixel.gif"),
                              f"{c.url}/v1/pixel/track?data={quote(data)}"],
                             capture_output=True, text=True, timeout=30, check=True)  # fmt: skip
    head = fetched.stdout.lower()
    assert head.startswith("http/1.1 200")
    assert "content-type: image/gif" in head
    assert "cache-control: no-store" in head
    assert (tmp_path / "pixel.gif").read_bytes().startswith(b"GIF89a")
    wrong = httpx.get(c.url + "/v1/pixel/track", params={"data": "%%%"})
    assert (wrong.status_code, wrong.headers["content-type"]) == (400, "image/gif")
    _seal(c)
    [event] = read_lines(c.layout.sealed_segments())
    assert (event["event"], event["event_type"], event["src"]) == ("Email Opened", "Email Opened",
                                                                    "segment")  # fmt: skip
    assert "writeKey" not in event
