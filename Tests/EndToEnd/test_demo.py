"""The README's demo command runs its walkthrough to the end (what a new user sees first), and
every step says what it showed: the sign-in, the refresh, and the myVOO data calls (1a-1b: no
token, 401 and where to sign in; 6a-6b: the data with the caller's BPId, the second call from
the identity cache, a user whose BPId is inactive refused).

The demo writes its files (its Gatehouse's and its upstream's logs, its database, its key ring)
under the run's workdir, so the last test of the suite (test_zz) searches them too; this test
also checks them itself, with every secret the demo's upstream and app recorded."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from gatelog import fields, message

ROOT = Path(__file__).resolve().parents[2]


def step(stdout, label, title_words):
    """The detail lines printed under the step `[label] …title_words…`."""
    match = re.search(rf"^\[{re.escape(label)}\] [^\n]*{re.escape(title_words)}[^\n]*\n((?:    [^\n]*\n)+)", stdout, re.MULTILINE)
    assert match, f"the walkthrough printed no step [{label}] … {title_words} …"
    return match.group(1)


def test_demo_walkthrough_completes(workdir, seen):
    data = workdir / "demo"
    recorded_before = len(seen.record.read_text().splitlines())
    result = subprocess.run([sys.executable, str(ROOT / "deploy/demo/walkthrough.py"), "--no-wait", "--data", str(data)],
                            capture_output=True, text=True, timeout=300, env=dict(os.environ))
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    assert "Walkthrough complete." in out
    port = re.search(r"Gatehouse\S* http://127\.0\.0\.1:(\d+)", out).group(1)

    # 1a-1b: a data call without a token is refused, and the answer says where to sign in.
    anonymous = step(out, "1a-1b", "asks for data anyway")
    assert "GET /api/contracts/42 -> HTTP 401 invalid_token" in anonymous
    assert 'WWW-Authenticate: Bearer realm="gatehouse"' in anonymous
    assert f"sign_in: authorization_endpoint http://127.0.0.1:{port}/oauth/authorize, client_id com.example.app" in anonymous
    assert f"sign_in.url: http://127.0.0.1:{port}/oauth/authorize?response_type=code&client_id=com.example.app" in anonymous

    # The sign-in, the refresh and its retry, the stolen code.
    assert "its own state back: matches" in step(out, "3b-4c", "signs in at the upstream")
    assert "HTTP 200, Cache-Control: no-store" in step(out, "5a", "redeems the code")
    assert "HTTP 200, the same pair" in step(out, "5a", "burns a refresh token")
    assert "wrong code_verifier: HTTP 400 invalid_grant" in step(out, "PKCE", "stolen")

    # 6a-6b: the data, with the caller's BPId; the second call from the cache; an inactive BPId refused.
    data_call = step(out, "6a-6b", "gets its data")
    assert "GET /api/contracts/42 -> HTTP 200; the backend received X-BPId: 1000123" in data_call
    assert "no Authorization header: True" in data_call
    cached = step(out, "6a-6b", "identity cache")
    assert "HTTP 200; identity service calls for this token: 1;" in cached
    assert "Gatehouse's log: relay=fast" in cached
    inactive = step(out, "6a-6b", "not active")
    assert "HTTP 403 forbidden:" in inactive and "bpid_status" in inactive

    # The sealed app's part.
    assert "the same pair" in step(out, "5a", "rotates Gatehouse's tokens")
    assert "refreshing afterwards: HTTP 400 invalid_grant" in step(out, "RFC 7009", "signs out")

    # Gatehouse's own log agrees: the four data calls, in order, and which path served them.
    log = (data / "gatehouse.log").read_text()
    calls = [fields(line) for line in log.splitlines()
             if message(line) == "request" and fields(line).get("path", "").startswith("/api/contracts")]
    assert [(call["status"], call.get("relay")) for call in calls] == \
        [("401", "general"), ("200", "general"), ("200", "fast"), ("403", "general")], calls

    # Nothing secret in the demo's logs or database (test_zz searches them again at the end).
    seen.add_key_ring(data / "session-keys")
    seen.harvest()
    demo_kinds = {json.loads(line)["kind"] for line in seen.record.read_text().splitlines()[recorded_before:]}
    assert {"Gatehouse code", "app PKCE verifier", "upstream access token", "upstream refresh token",
            "upstream client secret", "Gatehouse refresh token", "Gatehouse state toward the upstream",
            "upstream authorization code"} <= demo_kinds, "the demo's upstream and app recorded their secrets"
    logs = sorted(data.glob("*.log"))
    assert {path.name for path in logs} >= {"gatehouse.log", "upstream.log"}
    assert [f"{path.name}: {kind} ({form})" for path in logs for kind, form in seen.find(path.read_bytes())] == []
    assert seen.find_in_sqlite(data / "gatehouse.sqlite") == []
