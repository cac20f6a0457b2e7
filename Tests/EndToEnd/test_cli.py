"""`gatehouse check-config`: every problem with its YAML path, non-zero exit; secrets never echoed."""

import os
import subprocess
from pathlib import Path

BINARY = os.environ.get("GATEHOUSE_BIN", str(Path(__file__).resolve().parents[2] / ".build/debug/gatehouse"))

BAD = """
server:
  public_base_url: http://gatehouse.example.com/
  colour: blue
store:
  sqlite_path: ./x.sqlite
upstreams:
  - name: legacy
    authorization_endpoint: https://as.example.com/authorize
    token_endpoint: https://as.example.com/token
    client_id: gatehouse
    client_secret: inline-secret-never-echoed
clients:
  - client_id: com.example.app
    upstream: legacy
    wiring: sideways
    redirect_uris: ["myapp:/cb"]
"""


def run(binary, path, env=None):
    return subprocess.run([binary, "check-config", str(path)], capture_output=True, text=True, timeout=30,
                          env=dict(os.environ, **(env or {})))


def test_check_config_lists_every_problem_with_its_path(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(BAD)
    result = run(BINARY, path)
    assert result.returncode == 78
    for expected in ["line 3: server.public_base_url", "line 4: server.colour: is not a known setting",
                     "line 12: upstreams[0].client_secret", "line 16: clients[0].wiring",
                     "line 17: clients[0].redirect_uris[0]"]:
        assert expected in result.stdout, result.stdout
    assert "inline-secret-never-echoed" not in result.stdout + result.stderr


def test_check_config_accepts_the_shipped_example(tmp_path):
    example = open(os.path.join(os.path.dirname(__file__), "../../deploy/gatehouse.example.yaml")).read()
    secret = tmp_path / "secret"
    secret.write_text("from-a-file\n")
    keys = tmp_path / "keys"
    assert subprocess.run([BINARY, "keys", "generate", "--file", str(keys)], capture_output=True, timeout=30).returncode == 0
    path = tmp_path / "example.yaml"
    path.write_text(example.replace("/run/credentials/gatehouse.service/ates-client-secret", str(secret))
                    .replace("/run/credentials/gatehouse.service/session-keys", str(keys)))
    result = run(BINARY, path)
    assert result.returncode == 0, result.stdout
    assert "OK (1 upstream(s), 2 client(s))" in result.stdout
