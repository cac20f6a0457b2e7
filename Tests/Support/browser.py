"""A real browser for end-to-end tests: Debian's Chromium (/usr/bin/chromium), headless, driven
by Debian's chromedriver (/usr/bin/chromedriver) through Selenium (the driver's path is given, so
Selenium Manager never downloads anything), with a profile outside the run's folder (its LevelDB
logs record visited URLs, which the suite's log scan would rightly call leaks); and the app's
loopback web server (RFC 8252 §7.3) that records where the browser came back to."""

import os
import shutil
import tempfile
from urllib.parse import parse_qs, urlsplit

import pytest
from contextlib import contextmanager

from sandbox.stubserver import StubHandler, StubServer

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


class LoopbackApp(StubServer):
    """The app's loopback web server: records the path and query of every request (a code, a
    state); `wait_for(path)` waits until one for that path arrived (no sleeping)."""

    class Handler(StubHandler):
        def do_GET(self):
            parts = urlsplit(self.path)
            self.stub.record((parts.path, {k: v[0] for k, v in parse_qs(parts.query).items()}))
            self.reply(200, b"<!doctype html><title>app</title><p id=done>back in the app</p>", "text/html")

    def wait_for(self, path, timeout=30):
        hits = self.wait_received(lambda hits: any(p == path for p, _ in hits), timeout,
                                  lambda hits: f"the browser never reached the app's {path} (app saw {[p for p, _ in hits]})")
        return next(q for p, q in hits if p == path)


@contextmanager
def chromium():
    """A headless Chromium (skipped when missing, except under CI, where it must be there)."""
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not os.access(path, os.X_OK)]
    if missing:
        message = f"{', '.join(missing)} missing: apt-get install chromium chromium-driver (.ci/run does)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="gatehouse-chromium-")
    options = Options()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     "--no-first-run", "--disable-extensions", "--disable-background-networking",
                     f"--user-data-dir={profile}"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)




@pytest.fixture(scope="module")
def browser():
    """The module's Chromium (import this fixture into a test module to use it)."""
    with chromium() as driver:
        yield driver
