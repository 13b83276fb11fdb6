"""Headless Chromium for the UI tests: Debian's chromium driven by its chromedriver through selenium.

    with chromium() as driver:            # a fresh profile in a temporary folder, removed afterwards
        driver.get(url)
        wait_for(driver, lambda d: ..., "what the page should show")

The browser runs with no background traffic of its own (no component updates, sync or first-run pages), so a
test sees only what the page itself asks for. `available()` says why it cannot run (None when it can).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from typing import Callable, Iterator

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
         "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage", "--window-size=1500,1300",
         "--force-color-profile=srgb")


def available() -> str | None:
    """None when headless Chromium can be driven here, else why not (a skip reason)."""
    if not (CHROMIUM and CHROMEDRIVER):
        return "headless Chromium is absent: apt-get install chromium chromium-driver (make setup tries)"
    try:
        import selenium.webdriver  # noqa: F401
    except ImportError:
        return "selenium is not installed (the test extra)"
    return None


@contextlib.contextmanager
def chromium() -> Iterator:
    """A headless Chromium with a fresh --user-data-dir (no driver download: Debian's chromedriver)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    opts = Options()
    opts.binary_location = CHROMIUM
    for arg in (*FLAGS, f"--user-data-dir={profile}"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def page_text(driver) -> str:
    return driver.find_element("tag name", "body").text


def wait_for(driver, check: Callable, what: str, timeout: float = 90):
    """The SPA renders after its API calls: poll until `check(driver)` is truthy; its value."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if value := check(driver):
                return value
        except Exception:  # noqa: BLE001  elements come and go while the SPA renders
            pass
        time.sleep(0.5)
    raise AssertionError(f"the page did not show {what} in {timeout}s; page text: " + page_text(driver)[:1500])
