"""A real browser: Debian's Chromium, headless, driven by Selenium through Debian's
chromedriver (nothing downloaded), opens a page served from one origin that loads
``@jitsu/sdk-js``'s browser build (tests/sdk, pinned) and a tracking pixel, both sending
to the collector on another origin. CORS preflights, the key's allowed origins, the user
agent, the page's URL and a ``sendBeacon`` on leaving the page all arrive, and the
events load with the parsed user agent. Segment's own browser SDK, analytics-next,
sends through the Segment API from the same browser, offline.

The beacon is sent by the page itself, as the SDK's beacon transport would send it
(a text/plain Blob to the same URL): in @jitsu/sdk-js 3.1.5's browser build,
``data-use-beacon-api`` has no effect, since ``init`` picks the transport before it reads
the option (``this.transport = this.beaconApi ? A : R`` runs while ``beaconApi`` is
still false), so the SDK itself never calls ``sendBeacon``."""

from __future__ import annotations

import base64
import functools
import http.server
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from eventpipe.processing.batch.job import process_once
from tests.conftest import WEB_JS, RunningCollector, read_lines
from tests.e2e.test_batch_pipeline import _query, _seal
from tests.process import free_port

SDK = Path(__file__).resolve().parents[1] / "sdk" / "node_modules" / "@jitsu" / "sdk-js"
PAGE = """<!doctype html>
<html><head><title>Pricing</title>
<script src="/lib.js" data-key="{key}" data-tracking-host="{collector}"></script>
</head><body>
<p>Pricing</p>
<img id="pixel" src="{collector}/v1/pixel/track?data={pixel}" alt="">
<script>
  window.jitsu("id", {{email: "ada@example.com", internal_id: "u-42"}});
  window.jitsu("track", "plan_viewed", {{plan: "pro"}});
  window.addEventListener("pagehide", () => {{
    if ({beacon}) {{  // what the SDK's beacon transport sends: text/plain, to the same URL
      const event = {{event_type: "page_left", url: location.href, eventn_ctx: {{}}}};
      navigator.sendBeacon("{collector}/api/v1/event?token={key}",
                           new Blob([JSON.stringify(event)], {{type: "{beacon_type}"}}));
    }} else {{
      window.jitsu("track", "page_left", {{}});
    }}
  }});
</script>
</body></html>
"""


@pytest.fixture
def site(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A static site on its own origin (http://127.0.0.1:<port>), serving ``root``."""
    root = tmp_path / "site"
    root.mkdir()
    assert (SDK / "dist/web/lib.js").exists(), "the JS SDK is not installed: run make test"
    shutil.copy(SDK / "dist/web/lib.js", root / "lib.js")
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", root
    server.shutdown()
    server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def _logged(c: RunningCollector, count: int, timeout: float = 20) -> list[dict[str, Any]]:
    """Wait until the collector logged ``count`` events (the browser sends on its own
    time), then seal and return them."""
    deadline = time.monotonic() + timeout
    while sum(len(p.read_bytes().splitlines()) for p in c.layout.active_segments()) < count:
        if time.monotonic() > deadline:
            got = [e.get("event_type") or e.get("event") for e in read_lines(
                c.layout.active_segments())]  # fmt: skip
            failed = read_lines(c.layout.failed_received("web"))
            pytest.fail(f"the browser's events did not all arrive: {got}; failed: {failed}")
        time.sleep(0.1)
    _seal(c)
    return read_lines(c.layout.sealed_segments())


@pytest.mark.parametrize(("beacon", "beacon_type"), [
    (False, ""), (True, "text/plain"), (True, "application/json")],
    ids=["fetch", "sendBeacon", "sendBeacon-json"])  # fmt: skip
def test_a_real_browser_sends_from_another_origin(
    beacon: bool,
    beacon_type: str,
    start_collector: Any,
    site: tuple[str, Path],
    browser: Any,
    spark: Any,
) -> None:
    origin, root = site
    by_type = {"warehouse": {"type": "duckdb", "table_name_template": "{{ event_type }}"}}
    c = start_collector(api_keys=[{"id": "web", "js": WEB_JS, "origins": [origin]}],
                        destinations=by_type)  # fmt: skip
    # The collector's origin differs from the page's: localhost, not 127.0.0.1.
    collector = c.url.replace("127.0.0.1", "localhost")
    pixel = base64.urlsafe_b64encode(orjson.dumps(
        {"writeKey": WEB_JS, "anonymousId": "reader", "event": "Pixel Seen"})).decode()  # fmt: skip
    (root / "index.html").write_text(PAGE.format(
        key=WEB_JS, collector=collector, pixel=pixel,
        beacon="true" if beacon else "false", beacon_type=beacon_type))  # fmt: skip
    browser.get(origin + "/index.html?utm_source=test")
    _wait_for(lambda: browser.execute_script("return document.readyState") == "complete")
    agent = browser.execute_script("return navigator.userAgent")
    browser.get("about:blank")  # leaving the page: pagehide's event goes by beacon or fetch
    # A request made while the page unloads is cancelled; a beacon is what outlives it.
    sent = ["Pixel Seen", "pageview", "plan_viewed", "user_identify"]
    events = _logged(c, 5 if beacon else 4)
    kinds = sorted(e.get("event_type") or e.get("event") for e in events)
    assert kinds == sorted([*sent, "page_left"] if beacon else sent)
    jitsu = [e for e in events if e.get("src") != "segment"]
    for event in jitsu:
        assert event["eventn_ctx"]["user_agent"] == agent  # the browser's own header
        assert event.get("src") != "api"  # a browser event: the lookups apply
        assert event["source_ip"] == "127.0.0.1"  # the connection's, not the page's claim
        assert event["api_key"] == "web"
        assert event["url"].startswith(origin + "/index.html?utm_source=test")
    viewed = next(e for e in jitsu if e["event_type"] == "plan_viewed")
    assert viewed["plan"] == "pro"
    assert viewed["user"]["email"] == "ada@example.com"
    report = process_once(c.config, spark)
    assert report is not None
    assert sum(report.failed.values()) == 0
    [(family, bot)] = _query(c, "SELECT DISTINCT eventn_ctx_parsed_ua_ua_family, "
                                "eventn_ctx_parsed_ua_bot FROM pageview")  # fmt: skip
    assert family.startswith(("Chrome", "HeadlessChrome", "Chromium"))
    assert bot is False


def test_a_browser_on_an_origin_the_key_does_not_allow_delivers_nothing(
    start_collector: Any, site: tuple[str, Path], browser: Any
) -> None:
    origin, root = site
    c = start_collector(api_keys=[{"id": "web", "js": WEB_JS,
                                   "origins": ["https://shop.example.com"]}])  # fmt: skip
    (root / "index.html").write_text(PAGE.format(
        key=WEB_JS, collector=c.url.replace("127.0.0.1", "localhost"), pixel="",
        beacon="false", beacon_type=""))  # fmt: skip
    browser.get(origin + "/index.html")
    _wait_for(lambda: browser.execute_script("return document.readyState") == "complete")
    time.sleep(1.0)  # what the page sends, it has sent
    # The browser asked first (a CORS preflight), was refused, and sent nothing.
    console = " ".join(entry["message"] for entry in browser.get_log("browser"))
    assert "blocked by CORS policy" in console
    assert sum(len(p.read_bytes().splitlines()) for p in c.layout.active_segments()) == 0


def _wait_for(condition: Any, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.1)


NEXT = SDK.parents[1] / "@segment" / "analytics-next" / "dist" / "umd"
NEXT_PAGE = """<!doctype html>
<html><head><title>Docs</title>
<script src="/analytics-next/bundles/index.js"></script>
</head><body><script>
  const analytics = AnalyticsNext.AnalyticsBrowser.load({{
    writeKey: "{key}", cdnURL: "{origin}", cdnSettings: {settings}}});
  analytics.page("Docs", "Install");
  analytics.identify("u-7", {{email: "grace@example.com"}});
  analytics.track("Order Completed", {{revenue: 42.5}});
</script></body></html>
"""


def test_segments_analytics_next_in_a_real_browser(
    start_collector: Any, site: tuple[str, Path], browser: Any, spark: Any
) -> None:
    """@segment/analytics-next 1.84.3's browser build (tests/sdk, pinned), offline: its
    settings given inline (``cdnSettings``, as its docs allow) instead of fetched from
    Segment's CDN, its lazily loaded bundles served from the page's origin
    (``cdnURL``), and its Segment.io destination pointed at the collector."""
    origin, root = site
    assert (NEXT / "index.js").exists(), "analytics-next is not installed: run make test"
    shutil.copytree(NEXT, root / "analytics-next" / "bundles")
    by_type = {"warehouse": {"type": "duckdb", "table_name_template": "{{ type }}"}}
    c = start_collector(api_keys=[{"id": "web", "js": WEB_JS, "origins": [origin]}],
                        destinations=by_type)  # fmt: skip
    host = c.url.replace("http://127.0.0.1", "localhost")  # another origin than the page's
    settings = {"integrations": {"Segment.io": {"apiKey": WEB_JS, "apiHost": f"{host}/v1",
                                                "protocol": "http"}}, "plan": {}}  # fmt: skip
    (root / "index.html").write_text(NEXT_PAGE.format(
        key=WEB_JS, origin=origin, settings=orjson.dumps(settings).decode()))  # fmt: skip
    browser.get(origin + "/index.html?utm_source=docs")
    agent = browser.execute_script("return navigator.userAgent")
    events = _logged(c, 3)
    assert sorted(e["type"] for e in events) == ["identify", "page", "track"]
    for event in events:
        assert event["src"] == "segment"
        assert event["api_key"] == "web"
        assert "writeKey" not in event  # the secret the page sent is not stored
        assert event["eventn_ctx"]["user_agent"] == agent
        assert event["context"]["page"]["url"] == origin + "/index.html?utm_source=docs"
        assert event["source_ip"] == "127.0.0.1"
    track = next(e for e in events if e["type"] == "track")
    assert (track["event_type"], track["properties"]["revenue"]) == ("Order Completed", 42.5)
    report = process_once(c.config, spark)
    assert report is not None
    assert sum(report.failed.values()) == 0
    [(family,)] = _query(c, "SELECT DISTINCT eventn_ctx_parsed_ua_ua_family FROM track")
    assert family.startswith(("Chrome", "HeadlessChrome", "Chromium"))


JITSU2 = SDK.parent / "js" / "dist" / "web" / "p.js.txt"
JITSU2_PAGE = """<!doctype html>
<html><head><title>Pricing</title>
<script src="{collector}/p.js" data-write-key="web:{key}"></script>
</head><body><script>
  window.jitsu.identify("u-42", {{email: "ada@example.com"}});
  window.jitsu.track("plan_viewed", {{plan: "pro"}});
  window.jitsu.group("g-1", {{name: "Acme"}});
</script></body></html>
"""


def test_jitsu_2s_script_loaded_from_the_collector(
    start_collector: Any, site: tuple[str, Path], browser: Any, spark: Any
) -> None:
    """@jitsu/js 1.11.0's browser script (``p.js``), as Jitsu 2's pages load it: from the
    collector (``server.jitsu_script``), whose origin it sends to, ``/api/s/<type>``
    with ``X-Write-Key: id:secret``; a page view on load, then the page's calls."""
    origin, root = site
    assert JITSU2.exists(), "@jitsu/js is not installed: run make test"
    by_type = {"warehouse": {"type": "duckdb", "table_name_template": "{{ type }}"}}
    c = start_collector(api_keys=[{"id": "web", "js": WEB_JS, "origins": [origin]}],
                        destinations=by_type, server={"jitsu_script": str(JITSU2)})  # fmt: skip
    collector = c.url.replace("127.0.0.1", "localhost")
    (root / "index.html").write_text(JITSU2_PAGE.format(key=WEB_JS, collector=collector))
    browser.get(origin + "/index.html?utm_source=test")
    agent = browser.execute_script("return navigator.userAgent")
    events = _logged(c, 4)
    assert sorted(e["type"] for e in events) == ["group", "identify", "page", "track"]
    for event in events:
        assert (event["src"], event["api_key"]) == ("segment", "web")
        assert event["context"]["library"]["name"] == "@jitsu/js"
        assert event["context"]["page"]["url"] == origin + "/index.html?utm_source=test"
        assert event["eventn_ctx"]["user_agent"] == agent
        assert event["source_ip"] == "127.0.0.1"
        assert "writeKey" not in event
    track = next(e for e in events if e["type"] == "track")
    assert (track["event"], track["properties"]["plan"]) == ("plan_viewed", "pro")
    assert track["userId"] == "u-42"
    report = process_once(c.config, spark)
    assert report is not None
    assert sum(report.failed.values()) == 0
    [(campaign,)] = _query(c, "SELECT context_campaign_source FROM page")
    assert campaign == "test"


RUDDER = SDK.parents[1] / "@rudderstack" / "analytics-js" / "dist" / "npm" / "modern"
RUDDER_PAGE = """<!doctype html>
<html><head><title>Docs</title>
<script src="/rudder.js"></script>
</head><body><script>
  const source = {{id: "eventpipe", name: "site", workspaceId: "local", enabled: true,
                  config: {{}}, destinations: []}};
  const analytics = new rudderanalytics.RudderAnalytics();
  analytics.load("{key}", "{collector}", {{getSourceConfig: () => ({{source}}),
                                          logLevel: "ERROR"}});
  analytics.page("Docs", "Install");
  analytics.identify("u-9", {{email: "lin@example.com"}});
  analytics.track("Order Completed", {{revenue: 42.5}});
  analytics.group("g-9", {{name: "Acme"}});
  analytics.alias("u-9", "anon-9");
</script></body></html>
"""


@pytest.mark.parametrize("down_first", [False, True], ids=["up", "down-then-up"])
def test_rudderstacks_browser_sdk(
    down_first: bool, start_collector: Any, site: tuple[str, Path], browser: Any, spark: Any
) -> None:
    """@rudderstack/analytics-js 3.34.1's bundled browser build (its plugins inside,
    nothing from RudderStack's CDN), its source config given by ``getSourceConfig``:
    every call arrives through the Segment API with the SDK's own headers (AnonymousId,
    SentAt, RSA-Retry-*) allowed by the preflight; ``down_first``: the page loads while
    the collector is down, and the SDK's retries arrive once it is up, once each."""
    origin, root = site
    bundle = RUDDER / "bundled" / "umd" / "index.js"
    assert bundle.exists(), "@rudderstack/analytics-js is not installed: run make test"
    shutil.copy(bundle, root / "rudder.js")
    port = free_port()
    collector = f"http://localhost:{port}"
    (root / "index.html").write_text(RUDDER_PAGE.format(key=WEB_JS, collector=collector))

    def start() -> RunningCollector:
        by_id = {"warehouse": {"type": "duckdb", "table_name_template": "{{ type }}",
                               "primary_key": ["eventn_ctx_event_id"]}}  # fmt: skip
        return start_collector(api_keys=[{"id": "web", "js": WEB_JS, "origins": [origin]}],
                               destinations=by_id, server={"port": port})  # fmt: skip

    c = None if down_first else start()
    browser.get(origin + "/index.html?utm_source=docs")
    agent = browser.execute_script("return navigator.userAgent")
    if c is None:
        _wait_for(lambda: any("ERR_CONNECTION_REFUSED" in entry["message"]
                              for entry in browser.get_log("browser")))  # fmt: skip
        time.sleep(2.0)  # some retries meet the closed port too
        c = start()
    events = _logged(c, 5, timeout=60)
    kinds = sorted(e["type"] for e in events)
    assert kinds == ["alias", "group", "identify", "page", "track"]
    for event in events:
        assert (event["src"], event["api_key"]) == ("segment", "web")
        assert event["eventn_ctx"]["user_agent"] == agent
        assert event["source_ip"] == "127.0.0.1"
        # RudderStack sends originalTimestamp and sentAt: the time is the client's,
        # corrected for its clock, not when the collector received it.
        assert event["_timestamp"] <= event["receivedAt"]
    track = next(e for e in events if e["type"] == "track")
    assert (track["event"], track["properties"]["revenue"]) == ("Order Completed", 42.5)
    report = process_once(c.config, spark)
    assert report is not None
    assert sum(report.failed.values()) == 0
    [(email,)] = _query(c, "SELECT context_traits_email FROM identify")
    assert email == "lin@example.com"
    loaded = {table: rows for (_, table), rows in report.loaded.items()}
    assert loaded == {"alias": 1, "group": 1, "identify": 1, "page": 1, "track": 1}


def test_analytics_next_retries_reach_a_collector_that_was_down(
    start_collector: Any, site: tuple[str, Path], browser: Any, spark: Any
) -> None:
    """The page loads while the collector is down: analytics-next's first attempts fail,
    and its retries (which add ``X-Retry-Count``, a header the preflight must allow)
    reach the collector once it is up. Each call is one row by its messageId."""
    origin, root = site
    shutil.copytree(NEXT, root / "analytics-next" / "bundles")
    port = free_port()
    host = f"localhost:{port}"
    settings = {"integrations": {"Segment.io": {"apiKey": WEB_JS, "apiHost": f"{host}/v1",
                                                "protocol": "http"}}, "plan": {}}  # fmt: skip
    (root / "index.html").write_text(NEXT_PAGE.format(
        key=WEB_JS, origin=origin, settings=orjson.dumps(settings).decode()))  # fmt: skip
    browser.get(origin + "/index.html")
    _wait_for(lambda: any("ERR_CONNECTION_REFUSED" in entry["message"]
                          for entry in browser.get_log("browser")))  # fmt: skip
    time.sleep(2.0)  # some retries meet the closed port too
    by_id = {"warehouse": {"type": "duckdb", "table_name_template": "{{ type }}",
                           "primary_key": ["eventn_ctx_event_id"]}}  # fmt: skip
    c = start_collector(api_keys=[{"id": "web", "js": WEB_JS, "origins": [origin]}],
                        destinations=by_id, server={"port": port})  # fmt: skip
    events = _logged(c, 3, timeout=60)
    assert sorted(e["type"] for e in events) == ["identify", "page", "track"]
    assert all(e["context"].get("library", {}).get("name") == "analytics.js" for e in events)
    report = process_once(c.config, spark)
    assert report is not None
    assert sum(report.failed.values()) == 0
    loaded = {table: rows for (_, table), rows in report.loaded.items()}
    assert loaded == {"identify": 1, "page": 1, "track": 1}
