"""Runs last (pytest orders files by name): no secret, code or token of the run appears in any
log the suite produced, nor in any of its databases.

The secrets are every one the tests saw (`seen`) and every one they did not see but the run
recorded: what each upstream received and issued (sandbox/dot/serve.py's secrets record:
the upstream tokens of sealed sessions, Gatehouse's PKCE verifiers and states, the upstream
codes, the client secrets), what the demo's app saw, and the keys of the session key rings.
Each is searched as it is, in hex, in base64 / base64url, and (base64url secrets) as the bytes
it stands for. A failure names the file and the kind of secret, never the secret.

The logs are every *.log under the run's temporary folder: Gatehouse's (the main instance,
the PostgreSQL cluster's, the connection-edge instances', the refresh and outage tests'), the
demo's, the upstreams' and the test PostgreSQL's own; and the server log of the PostgreSQL
that scripts/test started (GATEHOUSE_TEST_POSTGRES_LOG), which records every statement
Gatehouse sent with its parameters.

Among them, the JSON logs (`--log-format json`, WORKDIR/*.json.log) and the audit files
(`observability.audit.file`, WORKDIR/*.audit.log) that the production-surface tests produce are
also read line by line: every line of a JSON log is a JSON object with ts, level and msg, and
every audit line (an audit file's, or one of the `gatehouse.audit` logger in any log) names its
`audit_event` and holds no secret.
"""

import json
import os
import subprocess
from pathlib import Path

import pytest


def leaks_in(files, seen, root):
    return [f"{path.relative_to(root) if path.is_relative_to(root) else path}: {kind} ({form})"
            for path in files for kind, form in seen.find(path.read_bytes())]


def test_no_secret_code_or_token_reaches_any_log(gatehouse, seen, workdir, tmp_path_factory):
    root = tmp_path_factory.getbasetemp()
    logs = sorted(root.rglob("*.log"))
    assert gatehouse["log"] in logs
    assert "gatehouse is ready" in gatehouse["log"].read_text()
    total = seen.harvest()
    assert total > 50, "the suite should have recorded the secrets it saw"
    print(f"\n{total} secrets searched for in {len(logs)} logs: " + ", ".join(str(p.relative_to(root)) for p in logs))
    assert leaks_in(logs, seen, root) == []


def test_no_secret_reaches_postgresqls_own_log(seen):
    if "GATEHOUSE_TEST_POSTGRES" not in os.environ:
        pytest.skip("no PostgreSQL in this run (GATEHOUSE_TEST_POSTGRES)")
    path = os.environ.get("GATEHOUSE_TEST_POSTGRES_LOG")
    assert path, "GATEHOUSE_TEST_POSTGRES_LOG must name the server log of GATEHOUSE_TEST_POSTGRES (scripts/test sets it)"
    log = Path(path)
    data = log.read_bytes()
    # The check means something only if the log shows what Gatehouse sent (scripts/postgres: log_statement=all).
    assert b"sessions" in data and b"parameters:" in data, \
        f"{log} records no statement of Gatehouse's: start PostgreSQL with scripts/postgres (log_statement=all)"
    seen.harvest()
    assert leaks_in([log], seen, log.parent) == []


def test_no_secret_in_any_database_of_the_run(seen, tmp_path_factory):
    """The SQLite databases of every instance of the run, and the PostgreSQL databases the
    run's tests made, searched once more now that every secret of the run is known."""
    seen.harvest()
    root = tmp_path_factory.getbasetemp()
    databases = sorted(root.rglob("*.sqlite"))
    assert databases, "the run made no SQLite database"
    leaks = [leak for database in databases for leak in seen.find_in_sqlite(database)]
    if "GATEHOUSE_TEST_POSTGRES" in os.environ:
        host, port = os.environ["GATEHOUSE_TEST_POSTGRES"].split(":")
        names = subprocess.run(["psql", "-h", host, "-p", port, "-U", "gatehouse", "-d", "gatehouse", "-tAc",
                                "SELECT datname FROM pg_database WHERE NOT datistemplate"],
                               capture_output=True, text=True, check=True, timeout=30).stdout.split()
        for name in names:
            dump = subprocess.run(["pg_dump", "-h", host, "-p", port, "-U", "gatehouse", "--data-only", name],
                                  capture_output=True, check=True, timeout=60).stdout
            leaks += [f"PostgreSQL database {name}: {kind} ({form})" for kind, form in seen.find(dump)]
    assert leaks == []


def _test_files_ran(request, *names):
    """Whether this session ran tests of the named files (then the files they write must exist)."""
    return any(item.path.name in names for item in request.session.items)


def test_json_logs_are_json_objects_and_audit_lines_name_their_event_and_hold_no_secret(seen, tmp_path_factory, request):
    root = tmp_path_factory.getbasetemp()
    json_logs = sorted(root.rglob("*.json.log"))
    audit_files = sorted(root.rglob("*.audit.log"))
    if _test_files_ran(request, "test_logs.py"):
        assert json_logs, "test_logs.py ran but left no JSON log (*.json.log)"
        assert audit_files, "test_logs.py ran but left no audit file (*.audit.log)"
    problems = []
    for path in json_logs:
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            try:
                value = json.loads(line)
            except ValueError:
                problems.append(f"{path.name}:{number}: not JSON")
                continue
            if not isinstance(value, dict) or not all(key in value for key in ("ts", "level", "msg")):
                problems.append(f"{path.name}:{number}: not an object with ts, level and msg")
            elif value.get("label") == "gatehouse.audit" and "audit_event" not in value:
                problems.append(f"{path.name}:{number}: an audit line without audit_event")
    for path in audit_files:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
        if not lines:
            problems.append(f"{path.name}: empty")
        problems += [f"{path.name}:{number}: no audit_event" for number, line in enumerate(lines, 1) if "audit_event" not in line]
    # Audit lines written with the other logs (no audit file configured), in any log of the run.
    for path in sorted(root.rglob("*.log")):
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if "gatehouse.audit" in line and "audit_event" not in line:
                problems.append(f"{path.relative_to(root)}:{number}: an audit line without audit_event")
    assert problems == []
    seen.harvest()
    assert leaks_in(json_logs + audit_files, seen, root) == []
