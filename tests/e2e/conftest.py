"""What the end-to-end tests share: one headless Chromium per module."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One Chromium for the module (each test's pages have an origin of their own)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    missing = "Chromium is not installed: make test installs chromium and chromium-driver"
    assert chromium, missing
    assert driver, missing
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--disable-gpu", "--no-first-run"):  # fmt: skip
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the page's console
    session = webdriver.Chrome(service=Service(driver), options=options)
    yield session
    session.quit()
