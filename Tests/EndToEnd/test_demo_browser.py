"""The URL each demo prints for a person to try the sign-in works in a real browser.

Each demo (the default walkthrough, `franceconnect`, `central`) runs as `scripts/demo` runs it,
without --no-wait: after its walkthrough it prints a Gatehouse /oauth/authorize URL (PKCE S256,
a loopback redirect to the demo's own little app) and waits. Debian's Chromium, headless, opens
that URL and does what the printed instructions say (the legacy server's login form with the
printed user and password; FranceConnect's "Continuer"; nothing at the central provider, which
signs its person in at once). It must end on the demo app's page saying "Signed in" with the
tokens the app redeemed, Gatehouse's sign-in cookies included (the central demo's is a
`__Secure-` cookie on http://127.0.0.1). Then SIGTERM stops the demo, which exits 0."""

import os
import queue
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from browser import browser  # noqa: F401 (the fixture)

ROOT = Path(__file__).resolve().parents[2]


class Demo:
    """A demo process whose printed lines are read as they come (no sleeping)."""

    def __init__(self, script, data):
        self.process = subprocess.Popen([sys.executable, str(ROOT / "deploy/demo" / script), "--data", str(data)],
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(os.environ))
        self.lines = queue.Queue()
        self.output = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def next_line(self, timeout=240):
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError("the demo printed nothing more:\n" + "".join(self.output[-40:]))
        if line is None:
            raise AssertionError(f"the demo ended (exit {self.process.wait()}) before printing its URL:\n" + "".join(self.output[-60:]))
        self.output.append(line)
        return line

    def browser_url(self):
        """The URL printed under "Open:" once the walkthrough is complete."""
        while "Open:" not in self.next_line():
            pass
        while not (line := self.next_line().strip()):
            pass
        assert "Walkthrough complete." in "".join(self.output), "".join(self.output[-40:])
        assert re.match(r"^http://127\.0\.0\.1:\d+/oauth/authorize\?", line), line
        return line

    def instructions(self):
        while not (line := self.next_line().strip()):
            pass
        return line

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(30)


def signed_in_page(browser, url):
    """The demo app's page the browser ends on: on the authorize URL's redirect URI (waiting for the
    URL first, so a heading of the provider's page, about to be left, is never read)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    redirect = parse_qs(urlsplit(url).query)["redirect_uri"][0]
    WebDriverWait(browser, 30, ignored_exceptions=(StaleElementReferenceException,)).until(
        lambda b: b.current_url.startswith(redirect) and b.find_elements(By.TAG_NAME, "h1"))
    heading = browser.find_element(By.TAG_NAME, "h1").text
    assert heading == "Signed in", browser.page_source[-2000:]
    shown = browser.find_element(By.TAG_NAME, "pre").text
    assert '"access_token"' in shown and '"refresh_token"' in shown and '"token_type": "Bearer"' in shown, shown
    return shown


@pytest.mark.parametrize("script", ["walkthrough.py", "franceconnect.py", "central.py"])
def test_the_demos_browser_url_signs_in_in_a_real_browser(browser, workdir, script):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    browser.delete_all_cookies()
    demo = Demo(script, workdir / f"demo-browser-{script.removesuffix('.py')}")
    try:
        url = demo.browser_url()
        told = demo.instructions()
        browser.get(url)
        if script == "walkthrough.py":
            user, password = re.search(r"Sign in as (\S+) / (\S+?)\.", told).groups()
            WebDriverWait(browser, 30).until(expected_conditions.presence_of_element_located((By.NAME, "username")))
            browser.find_element(By.NAME, "username").send_keys(user)
            browser.find_element(By.NAME, "password").send_keys(password)
            browser.find_element(By.NAME, "password").submit()
        elif script == "franceconnect.py":
            assert "Continuer" in told
            WebDriverWait(browser, 30).until(expected_conditions.element_to_be_clickable((By.ID, "continue")))
            browser.find_element(By.ID, "identity-0").click()
            browser.find_element(By.ID, "continue").click()
        shown = signed_in_page(browser, url)
        if script == "franceconnect.py":
            assert '"id_token"' in shown, shown
    finally:
        status = demo.stop()
    assert status == 0, "".join(demo.output[-40:])
