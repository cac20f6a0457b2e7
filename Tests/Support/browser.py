"""A real browser for end-to-end tests: Debian's Chromium (/usr/bin/chromium), headless, driven
by Debian's chromedriver (/usr/bin/chromedriver) through Selenium (the driver's path is given, so
Selenium Manager never downloads anything), with a profile outside the run's folder (its LevelDB
logs record visited URLs, which the suite's log scan would rightly call leaks); and the app's
loopback web server (RFC 8252 §7.3) that records where the browser came back to."""

import os
import shutil
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest
from contextlib import contextmanager

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


class LoopbackApp:
    """The app's loopback web server: records the path and query of every request (a code, a
    state); `wait_for(path)` waits until one for that path arrived (no sleeping)."""

    def __init__(self):
        self.condition = threading.Condition()
        self.hits = []
        app = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                parts = urlsplit(self.path)
                with app.condition:
                    app.hits.append((parts.path, {k: v[0] for k, v in parse_qs(parts.query).items()}))
                    app.condition.notify_all()
                body = b"<!doctype html><title>app</title><p id=done>back in the app</p>"
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_for(self, path, timeout=30):
        with self.condition:
            if not self.condition.wait_for(lambda: any(p == path for p, _ in self.hits), timeout):
                raise AssertionError(f"the browser never reached the app's {path} (app saw {[p for p, _ in self.hits]})")
            return next(q for p, q in self.hits if p == path)

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


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
