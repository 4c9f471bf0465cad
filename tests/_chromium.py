"""Debian's headless Chromium through selenium and chromium-driver, for the console's browser tests.
A missing browser fails the test that asks for one (``.ci/run`` installs it), never skips it."""

from __future__ import annotations

import shutil

from selenium import webdriver
from selenium.webdriver.chrome.service import Service


def chromium(*, browser_log: bool = False) -> webdriver.Chrome:
    """A headless Chromium 1280×1000; ``browser_log``: keep its console (CSP violations, script errors)."""
    for tool in ("chromium", "chromedriver"):
        assert shutil.which(tool), f"{tool} is missing: apt-get install chromium chromium-driver (.ci/run does)"
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or ""
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 "--window-size=1280,1000"):
        options.add_argument(flag)
    if browser_log:
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver") or ""))
