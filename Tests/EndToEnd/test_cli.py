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


DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def check_franceconnect_example(tmp_path, name, env):
    keys = tmp_path / f"{name}.keys"
    if not keys.exists():
        assert subprocess.run([BINARY, "keys", "generate", "--file", str(keys)], capture_output=True, timeout=30).returncode == 0
    path = tmp_path / name
    path.write_text((DEPLOY / name).read_text().replace("/run/credentials/gatehouse.service/session-keys", str(keys)))
    return run(BINARY, path, env)


def test_check_config_accepts_the_franceconnect_v2_example(tmp_path):
    result = check_franceconnect_example(tmp_path, "franceconnect-v2.example.yaml",
                                         {"FRANCECONNECT_CLIENT_SECRET": "integration-secret-never-echoed"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "OK (1 upstream(s), 1 client(s))" in result.stdout
    assert "integration-secret-never-echoed" not in result.stdout + result.stderr


def test_check_config_accepts_the_franceconnect_v1_example(tmp_path):
    result = check_franceconnect_example(tmp_path, "franceconnect-v1.example.yaml",
                                         {"FRANCECONNECT_V1_CLIENT_SECRET": "integration-secret-of-32-bytes-never-echoed"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "OK (1 upstream(s), 1 client(s))" in result.stdout


def test_check_config_wants_the_franceconnect_examples_secret(tmp_path):
    """The examples name their secret's environment variable: without it, they are refused."""
    env = {name: "" for name in ("FRANCECONNECT_CLIENT_SECRET", "FRANCECONNECT_V1_CLIENT_SECRET")}
    for name in ("franceconnect-v2.example.yaml", "franceconnect-v1.example.yaml"):
        result = check_franceconnect_example(tmp_path, name, env)
        assert result.returncode == 78, result.stdout
        assert "upstreams[0].client_secret_env" in result.stdout, result.stdout


BAD_FRANCECONNECT = """
server:
  public_base_url: https://gatehouse.example.com
store:
  sqlite_path: ./x.sqlite
upstreams:
  - name: fc
    kind: franceconnect
    version: v2
    platform: integration
    client_id: gatehouse
    client_secret: inline-franceconnect-secret-never-echoed
    colour: blue
clients:
  - client_id: com.example.app
    upstream: fc
    redirect_uris: ["myapp:/cb"]
    post_logout_redirect_uris: ["myapp:/signed-out"]
"""


def test_check_config_refuses_an_inline_franceconnect_secret_and_an_unknown_key(tmp_path):
    path = tmp_path / "bad-franceconnect.yaml"
    path.write_text(BAD_FRANCECONNECT)
    result = run(BINARY, path)
    assert result.returncode == 78, result.stdout
    for expected in ["line 12: upstreams[0].client_secret", "line 13: upstreams[0].colour: is not a known setting"]:
        assert expected in result.stdout, result.stdout
    assert "inline-franceconnect-secret-never-echoed" not in result.stdout + result.stderr


CENTRAL_FIXTURES = Path(__file__).resolve().parents[1] / "Fixtures/central"
CENTRAL_FILES = {  # the example's credential files -> test-only fixtures standing in for them
    "/run/credentials/gatehouse.service/central-app-s2s.pem": "app-private.pem",
    "/run/credentials/gatehouse.service/central-jwt-current.pem": "jwt-a.pem",
    "/run/credentials/gatehouse.service/central-jwt-previous.pem": "jwt-b.pem",
}


def check_central_example(tmp_path, replace=None):
    """deploy/central.example.yaml with its credential files in `tmp_path` (a key ring made here, the
    RSA keys copied from Tests/Fixtures/central), then `replace` (old -> new) applied to the text."""
    keys = tmp_path / "central.keys"
    if not keys.exists():
        assert subprocess.run([BINARY, "keys", "generate", "--file", str(keys)], capture_output=True, timeout=30).returncode == 0
    text = (DEPLOY / "central.example.yaml").read_text().replace("/run/credentials/gatehouse.service/session-keys", str(keys))
    for credential, fixture in CENTRAL_FILES.items():
        copy = tmp_path / Path(credential).name
        copy.write_bytes((CENTRAL_FIXTURES / fixture).read_bytes())
        copy.chmod(0o600)
        text = text.replace(credential, str(copy))
    for old, new in (replace or {}).items():
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / "central.example.yaml"
    path.write_text(text)
    return run(BINARY, path)


def test_check_config_accepts_the_central_example(tmp_path):
    result = check_central_example(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "OK (1 upstream(s), 1 client(s))" in result.stdout
    for fixture in CENTRAL_FILES.values():  # no key material echoed
        body = "".join(line for line in (CENTRAL_FIXTURES / fixture).read_text().splitlines() if not line.startswith("-----"))
        assert body[:40] not in result.stdout + result.stderr


def test_check_config_wants_the_central_examples_key_files(tmp_path):
    """A key file that cannot be read, or that holds no RSA private key, is named with its YAML path."""
    result = check_central_example(tmp_path, {str(tmp_path / "central-app-s2s.pem"): str(tmp_path / "missing.pem")})
    assert result.returncode == 78, result.stdout
    assert "upstreams[0].s2s_private_key_file" in result.stdout, result.stdout
    (tmp_path / "not-a-key.pem").write_text("not a key\n")
    result = check_central_example(tmp_path, {str(tmp_path / "central-jwt-previous.pem"): str(tmp_path / "not-a-key.pem")})
    assert result.returncode == 78, result.stdout
    assert "upstreams[0].signing_key_files" in result.stdout, result.stdout


def test_check_config_refuses_a_client_secret_on_the_central_example(tmp_path):
    """A central upstream has no client secret: the example with its key given as `client_secret_file`
    (or an environment variable) is refused, and the key's own setting is then missing."""
    for setting in ("client_secret_file: ", "client_secret_env: CENTRAL_KEY_NEVER_READ  # "):
        result = check_central_example(tmp_path, {"s2s_private_key_file: ": setting})
        assert result.returncode == 78, result.stdout
        assert f"upstreams[0].{setting.split(':')[0]}" in result.stdout, result.stdout
        assert "upstreams[0].s2s_private_key_file" in result.stdout, result.stdout
