"""The console in a real browser (Debian's Chromium, headless): logged in with the admin
token, its pages load with no console error and no request outside the console; the
live view shows an event posted by the test within 2 s, and an event whose fields hold
HTML and script renders as text (nothing of it runs or becomes an element); of two failed
events, the one ticked on the failed page is replayed and loads, the other stays."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.conftest import WEB_JS
from tests.integration.test_console import TOKEN, RunningConsole, _fail
from tests.process import write_config

HOSTILE = {
    "event_type": "xss",
    "title": "<script>window.pwned = 1</script>",
    "url": "javascript:window.pwned=2",
    "img": '<img src=x onerror="window.pwned=3">',
}


@pytest.fixture
def console(start_collector: Any, tmp_path: Path) -> Iterator[tuple[RunningConsole, Any]]:
    collector = start_collector(console={"token": TOKEN, "sample_seconds": 0.5})
    # The file a replay started from the page reads (its own process, its own Spark).
    config_file = write_config(tmp_path / "eventpipe.yaml", collector.layout.root, 0)
    running = RunningConsole(collector.config, config_file)
    yield running, collector
    running.stop()


def _errors(browser: Any) -> list[str]:
    return [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]


def _requested(browser: Any) -> set[str]:
    """Every origin the page asked something of (its resources, fetches and streams)."""
    urls = browser.execute_script(
        "return [location.href, ...performance.getEntriesByType('resource').map(e => e.name)]"
    )
    return {"/".join(url.split("/")[:3]) for url in urls}


def _first_text(browser: Any, selector: str) -> str | None:
    """The text of the first element ``selector`` finds; None while there is none, or
    when the page drew it again between the find and the read (the overview redraws its
    table as its figures come)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        found = browser.find_elements(By.CSS_SELECTOR, selector)
        return str(found[0].text) if found else None
    except StaleElementReferenceException:
        return None


def test_the_console_in_a_browser(browser: Any, console: Any) -> None:
    from selenium.webdriver.common.by import By

    running, collector = console
    browser.get(running.url + "/")  # not logged in: the login page
    assert browser.current_url == running.url + "/login"
    browser.find_element(By.NAME, "token").send_keys(TOKEN)
    browser.find_element(By.CSS_SELECTOR, "form.login button").click()
    deadline = time.monotonic() + 10
    while not (text := _first_text(browser, "#destinations tr[data-destination]")):
        assert time.monotonic() < deadline, browser.page_source
        time.sleep(0.1)
    assert text.startswith("warehouse duckdb")
    assert _requested(browser) == {running.url}
    assert _errors(browser) == []

    browser.get(running.url + "/live")
    time.sleep(1.0)  # the page's stream is open (it shows what arrives from then on)
    posted = httpx.post(collector.url + "/api/v1/event", params={"token": WEB_JS},
                        content=orjson.dumps([HOSTILE]))  # fmt: skip
    assert posted.status_code == 200
    sent = time.monotonic()
    while not browser.find_elements(By.CSS_SELECTOR, "#events li"):
        assert time.monotonic() - sent < 2, "the live view showed no event within 2 s"
        time.sleep(0.05)
    shown = browser.find_element(By.CSS_SELECTOR, "#events li pre").text
    for value in HOSTILE.values():
        assert orjson.dumps(value).decode() in shown  # the fields, as text
    # Nothing of it ran or became an element.
    assert browser.execute_script("return window.pwned === undefined")
    assert browser.find_elements(By.CSS_SELECTOR, "#events script, #events img") == []
    # The one link the page made: to the event's trace, by its id.
    [link] = browser.find_elements(By.CSS_SELECTOR, "#events a")
    event_id = orjson.loads(shown)["eventn_ctx"]["event_id"]
    assert link.get_attribute("href") == f"{running.url}/trace?id={event_id}"
    # Beside it, as its client sent it (the collector's sample while a view is open).
    while not browser.find_elements(By.CSS_SELECTOR, "#events li pre.received"):
        assert time.monotonic() - sent < 3, "the event as received not shown within 3 s"
        time.sleep(0.05)
    as_sent = browser.find_element(By.CSS_SELECTOR, "#events li pre.received").text
    assert orjson.loads(as_sent) == HOSTILE
    assert browser.find_elements(By.CSS_SELECTOR, "#events script, #events img") == []
    assert _requested(browser) == {running.url}
    assert _errors(browser) == []

    # Replay from the page, of the events ticked: the one ticked loads, the other stays.
    _fail(collector, 7, "column n (INT64) cannot take seven", eventn_ctx={"event_id": "e7"})
    _fail(collector, 8, "column n (INT64) cannot take eight", eventn_ctx={"event_id": "e8"})
    browser.get(running.url + "/failed?destination=warehouse")
    assert "column n (INT64) cannot take seven" in browser.find_element(By.ID, "reasons").text
    browser.find_element(By.CSS_SELECTOR, 'input[name="event_id"][value="e7"]').click()
    browser.find_element(By.CSS_SELECTOR, "form.replay-chosen button").click()
    deadline = time.monotonic() + 180
    while not browser.find_elements(By.CSS_SELECTOR, "#replay.replay-done, #replay.replay-failed"):
        assert time.monotonic() < deadline, browser.page_source
        time.sleep(2)
        browser.refresh()
    assert browser.find_elements(By.CSS_SELECTOR, "#replay.replay-done"), browser.page_source
    assert "1 chosen event(s)" in browser.find_element(By.CSS_SELECTOR, "#replay h2").text
    assert "warehouse.events: 1 rows" in browser.find_element(By.CSS_SELECTOR, "#replay pre").text
    left = browser.find_element(By.ID, "failed").text
    assert ("e8" in left, "e7" in left) == (True, False)  # the one not ticked stays
    assert _errors(browser) == []
