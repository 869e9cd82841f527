"""Screenshots of the console's pages for docs/console.md (docs/console/*.png), taken in
Debian's headless Chromium from a collector and a console on 127.0.0.1, with a few events
posted and a failed event written, and two runs of the job into DuckDB (the second adds a
column), as a user would see them:

    PYTHONPATH=src .venv/bin/python scripts/console_screenshots.py
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import orjson  # noqa: E402
from tests.conftest import WEB_JS, RunningCollector, make_config  # noqa: E402
from tests.integration.test_console import TOKEN, RunningConsole, _fail  # noqa: E402

PAGES = {
    "login": "/login",
    "overview": "/",
    "live": "/live",
    "failed": "/failed",
    "runs": "/runs",
    "ledger": "/ledger",
    "destinations": "/destinations",
}


def main() -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    out = ROOT / "docs" / "console"
    out.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="eventpipe-screenshots-") as tmp:
        config = make_config(
            Path(tmp) / "data",
            console={"token": TOKEN, "sample_seconds": 1},
            destinations={"warehouse": {"type": "duckdb",
                                        "table_name_template": "{{ event_type }}"}},
        )  # fmt: skip
        collector = RunningCollector(config)
        console = RunningConsole(config)
        options = webdriver.ChromeOptions()
        options.binary_location = "/usr/bin/chromium"
        for argument in ("--headless=new", "--no-sandbox", "--disable-gpu",
                         "--window-size=1100,800"):  # fmt: skip
            options.add_argument(argument)
        browser = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
        try:
            browser.get(console.url + "/login")
            browser.save_screenshot(str(out / "login.png"))
            browser.find_element(By.NAME, "token").send_keys(TOKEN)
            browser.find_element(By.CSS_SELECTOR, "form.login button").click()
            _fail(collector, 1, "column total (INT64) cannot take abc", event_type="checkout",
                  total="abc")  # fmt: skip
            browser.get(console.url + "/live")
            time.sleep(1)
            for n in range(3):
                event = {"event_type": ["page_view", "checkout", "signup"][n], "n": n,
                         "url": f"https://shop.example.com/p/{n}"}  # fmt: skip
                httpx.post(collector.url + "/api/v1/event", params={"token": WEB_JS},
                           content=orjson.dumps([event]))  # fmt: skip
                time.sleep(0.4)
            time.sleep(1.5)
            browser.save_screenshot(str(out / "live.png"))
            event_id = orjson.loads(
                next(p for p in config.layout.active_segments() if p.stat().st_size)
                .read_bytes()
                .splitlines()[0]
            )["eventn_ctx"]["event_id"]
            _two_runs(collector, config)
            for name in ("overview", "failed", "runs", "ledger", "destinations"):
                browser.get(console.url + PAGES[name])
                time.sleep(2.5)
                browser.save_screenshot(str(out / f"{name}.png"))
            browser.get(console.url + f"/trace?id={event_id}")
            time.sleep(1.5)
            browser.save_screenshot(str(out / "trace.png"))
        finally:
            browser.quit()
            console.stop()
            collector.stop()
    print(f"wrote {', '.join(sorted(p.name for p in out.glob('*.png')))} to {out}")


def _two_runs(collector: RunningCollector, config: Any) -> None:
    """The events so far processed; then one with a new field, processed too."""
    from tests.e2e.test_batch_pipeline import _seal

    from eventpipe.processing.batch.job import process_once
    from eventpipe.processing.runtime.spark import start_session

    spark = start_session({"spark.master": "local[2]", "spark.ui.showConsoleProgress": "false"})
    _seal(collector)
    process_once(config, spark)
    event = {"event_type": "checkout", "n": 4, "coupon": "WINTER"}
    httpx.post(collector.url + "/api/v1/event", params={"token": WEB_JS},
               content=orjson.dumps([event]))  # fmt: skip
    _seal(collector)
    process_once(config, spark)
    spark.stop()


if __name__ == "__main__":
    main()
