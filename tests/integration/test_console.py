"""The web console over real HTTP beside a running collector: the admin token on every
page and API call (a session cookie or a bearer token), CSRF on every POST, the
security headers on every answer, the overview's figures, and the live view's stream of
arriving events, hostile fields sent as JSON text."""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import uvicorn

from eventpipe.config import Config
from eventpipe.console.app import console_app
from eventpipe.errors import ConfigError
from tests.conftest import WEB_JS, make_config

TOKEN = "console-token-" + "x" * 20
PAGES = ["/", "/live", "/destinations"]
API = ["/api/overview", "/api/overview/stream", "/api/events/stream", "/api/destinations"]


class RunningConsole:
    def __init__(self, config: Config, config_file: Path | None = None) -> None:
        self.server = uvicorn.Server(uvicorn.Config(
            console_app(config, config_file), host="127.0.0.1", port=0, log_level="warning",
            lifespan="on",
        ))  # fmt: skip
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 15
        while not self.server.started:
            assert self.thread.is_alive(), "the console stopped"
            assert time.monotonic() < deadline, "the console did not start"
            time.sleep(0.01)
        self.url = f"http://127.0.0.1:{self.server.servers[0].sockets[0].getsockname()[1]}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)


@pytest.fixture
def console(start_collector: Any) -> Iterator[tuple[RunningConsole, Any]]:
    collector = start_collector(console={"token": TOKEN, "sample_seconds": 0.5})
    running = RunningConsole(collector.config)
    yield running, collector
    running.stop()


@contextlib.contextmanager
def _logged_in(url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url, timeout=10) as client:
        form = client.get("/login")
        csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
        assert csrf is not None
        answer = client.post("/login", data={"csrf": csrf.group(1), "token": TOKEN})
        assert answer.status_code == 303, answer.text
        yield client


def test_every_page_and_api_call_needs_the_admin_token(console: Any) -> None:
    running, _ = console
    with httpx.Client(base_url=running.url, timeout=10) as anyone:
        _only_with_the_token(anyone)


def _only_with_the_token(anyone: httpx.Client) -> None:
    for path in PAGES:
        answer = anyone.get(path)
        assert (answer.status_code, answer.headers["location"]) == (303, "/login"), path
    for path in API:
        assert anyone.get(path).status_code == 401, path
        wrong = anyone.get(path, headers={"Authorization": "Bearer " + "y" * 34})
        assert wrong.status_code == 401, path
    # A wrong token at the login form: refused, no session.
    form = anyone.get("/login")
    csrf = re.search(r'name="csrf" value="([^"]+)"', form.text).group(1)  # type: ignore[union-attr]
    refused = anyone.post("/login", data={"csrf": csrf, "token": "guess" * 6})
    assert refused.status_code == 401
    assert "eventpipe_console" not in refused.cookies
    assert anyone.get("/").status_code == 303
    # A script: the token as a bearer token, for the API only.
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    assert anyone.get("/api/overview", headers=bearer).status_code == 200
    assert anyone.get("/", headers=bearer).status_code == 303


def test_a_post_without_its_csrf_token_is_refused(console: Any) -> None:
    running, _ = console
    with _logged_in(running.url) as client, httpx.Client(base_url=running.url) as elsewhere:
        _posts_need_their_csrf_token(client, elsewhere)


def _posts_need_their_csrf_token(client: httpx.Client, elsewhere: httpx.Client) -> None:
    page = client.get("/")
    assert page.status_code == 200
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)  # type: ignore[union-attr]
    assert client.post("/logout").status_code == 403
    assert client.post("/logout", data={"csrf": "forged"}).status_code == 403
    days = {"destination": "warehouse", "from": "2026-11-01", "dry_run": "1"}
    assert client.post("/runs/reprocess", data=days).status_code == 403
    assert client.get("/").status_code == 200  # still logged in
    # The login form's own token: a login posted from elsewhere has no matching cookie.
    forged = elsewhere.post("/login", data={"csrf": "x", "token": TOKEN})
    assert forged.status_code == 403
    assert client.post("/logout", data={"csrf": csrf}).status_code == 303
    assert client.get("/").status_code == 303  # logged out


def test_every_answer_has_a_strict_policy_and_no_secret(console: Any) -> None:
    running, _ = console
    with _logged_in(running.url) as client:
        _strict_answers(client)


def _strict_answers(client: httpx.Client) -> None:
    for path in ["/login", *PAGES, "/api/overview", "/static/console.js"]:
        answer = client.get(path)
        assert answer.status_code == 200, path
        policy = answer.headers["content-security-policy"]
        assert "script-src 'self'" in policy
        assert "default-src 'none'" in policy
        assert "frame-ancestors 'none'" in policy
        assert answer.headers["x-content-type-options"] == "nosniff"
        assert answer.headers["cache-control"] == "no-store"
        for secret in (TOKEN, WEB_JS):
            assert secret not in answer.text, path
    session = client.cookies.jar
    [cookie] = [c for c in session if c.name == "eventpipe_console"]
    assert cookie.has_nonstandard_attr("HttpOnly")
    assert cookie.get_nonstandard_attr("SameSite") == "strict"


def test_the_overview_serves_the_figures_status_watch_draws(console: Any) -> None:
    running, _ = console
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    deadline = time.monotonic() + 10
    while True:
        body = httpx.get(running.url + "/api/overview", headers=bearer, timeout=10).json()
        if len(body["history"]) >= 2:
            break
        assert time.monotonic() < deadline, body
        time.sleep(0.2)
    latest = body["latest"]
    [warehouse] = latest["destinations"]
    assert warehouse["id"] == "warehouse"
    assert warehouse["type"] == "duckdb"
    assert warehouse["loaded"] == 0
    assert latest["incoming_bytes_per_second"] is not None


def test_the_live_stream_shows_an_event_within_two_seconds_as_json_text(console: Any) -> None:
    running, collector = console
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    hostile = {"event_type": "xss", "title": "<script>alert(1)</script>",
               "url": "javascript:alert(1)", "img": '<img src=x onerror="alert(1)">'}  # fmt: skip
    # As sent: a writeKey field and a key's secret in a value, which nothing stores.
    sent_as = {**hostile, "writeKey": "wk-123", "note": f"pasted {WEB_JS} here"}
    seen: dict[str, Any] = {}
    with httpx.stream("GET", running.url + "/api/events/stream?type=xss", headers=bearer,
                      timeout=10) as stream:  # fmt: skip
        assert stream.headers["content-type"].startswith("text/event-stream")
        mark = collector.layout.received_watching  # the open view asks for a sample
        deadline = time.monotonic() + 5
        while not mark.exists():
            assert time.monotonic() < deadline, "the live view did not mark itself open"
            time.sleep(0.05)
        sent = time.monotonic()
        posted = httpx.post(collector.url + "/api/v1/event", params={"token": WEB_JS},
                            content=orjson.dumps([{"event_type": "other"}, sent_as]))  # fmt: skip
        assert posted.status_code == 200
        kind = None
        for line in stream.iter_lines():
            if line.startswith("event: "):
                kind = line.removeprefix("event: ")
            elif line.startswith("data: ") and kind in ("event", "received"):
                seen[kind] = orjson.loads(line.removeprefix("data: "))
                if len(seen) == 2:
                    break
            assert time.monotonic() - sent < 2, f"not within 2 s: {sorted(seen)}"
    event = seen["event"]
    assert event["event_type"] == "xss"  # filtered: the other type is not shown
    assert (event["title"], event["url"], event["img"]) == (
        hostile["title"],
        hostile["url"],
        hostile["img"],
    )
    # Beside it, as its client sent it: nothing added, the secrets scrubbed as stored.
    assert seen["received"]["event_id"] == event["eventn_ctx"]["event_id"]
    assert seen["received"]["received"] == {**hostile, "note": "pasted [redacted] here"}
    assert event["note"] == "pasted [redacted] here"
    assert "writeKey" not in event
    assert {"api_key", "source_ip"} <= event.keys()
    # Its trace shows it as received too (from the same sample).
    traced = httpx.get(running.url + "/api/trace", headers=bearer,
                       params={"id": event["eventn_ctx"]["event_id"]}).json()  # fmt: skip
    assert traced["event"] == event
    assert traced["received"] == seen["received"]["received"]


def test_a_console_token_that_is_short_or_an_event_key_is_refused(tmp_path: Any) -> None:
    with pytest.raises(ConfigError, match="at least 24 characters"):
        make_config(tmp_path, console={"token": "short"})
    with pytest.raises(ConfigError, match="one of the api keys' secrets"):
        make_config(tmp_path, console={"token": WEB_JS + "-and-some-more"},
                    api_keys=[{"id": "web", "js": WEB_JS + "-and-some-more"}])  # fmt: skip


def _fail(collector: Any, n: int, error: str, **event: Any) -> None:
    """An EventError in the warehouse's failed/ file, as the pipeline writes one."""
    from datetime import UTC, datetime

    from eventpipe.events import Stage, event_error_line

    line = event_error_line(event={"n": n, **event}, error=error, stage=Stage.LOADING,
                            when=datetime(2026, 11, 20, 10, n, tzinfo=UTC), api_key="web",
                            destination="warehouse", table="events")  # fmt: skip
    path = collector.layout.failed_destination("warehouse")
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("ab") as f:
        f.write(line)


def test_failed_events_by_reason_shown_as_text(console: Any) -> None:
    running, collector = console
    _fail(collector, 1, "column n (INT64) cannot take five")
    _fail(collector, 2, "column n (INT64) cannot take five")
    _fail(collector, 3, "<script>alert(1)</script>", title="<img src=x onerror=alert(1)>",
          eventn_ctx={"event_id": '"><script>alert(2)</script>'})  # fmt: skip
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    body = httpx.get(running.url + "/api/failed?destination=warehouse", headers=bearer).json()
    assert [r["event"]["n"] for r in body["records"]] == [3, 2, 1]  # the newest first
    assert body["reasons"] == [
        {"reason": "column n (INT64) cannot take five", "events": 2},
        {"reason": "<script>alert(1)</script>", "events": 1},
    ]
    reason = {"destination": "warehouse", "reason": "<script>alert(1)</script>"}
    one = httpx.get(running.url + "/api/failed", headers=bearer, params=reason)
    assert [r["event"]["n"] for r in one.json()["records"]] == [3]
    assert httpx.get(running.url + "/api/failed?destination=../../etc",
                     headers=bearer).status_code == 404  # fmt: skip
    with _logged_in(running.url) as client:
        page = client.get("/failed", params={"destination": "warehouse"})
        assert page.status_code == 200
        assert "<script>alert(1)" not in page.text
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page.text
        assert "<img src=x" not in page.text
        # Its id, a checkbox's value for a replay of the events ticked: as text too.
        assert "<script>alert(2)" not in page.text
        assert 'value="&#34;&gt;&lt;script&gt;alert(2)&lt;/script&gt;"' in page.text
        # A replay is a POST: without the session's CSRF token, refused.
        refused = client.post("/failed/replay", data={"destination": "warehouse"})
        assert refused.status_code == 403
        runs = client.get("/runs")
        assert runs.status_code == 200
        assert "No run yet." in runs.text
        books = client.get("/ledger")
        assert books.status_code == 200
        assert "No batch run yet." in books.text
    assert httpx.get(running.url + "/api/runs", headers=bearer).json() == []
    # A selection past 1,000 event ids is refused before any replay starts.
    many = {"destination": "warehouse", "event_id": [f"e{n}" for n in range(1001)]}
    refused = httpx.post(running.url + "/api/failed/replay", headers=bearer, data=many)
    assert refused.status_code == 400
    assert httpx.get(running.url + "/api/replays", headers=bearer).json() == []
