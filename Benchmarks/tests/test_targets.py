"""The targets, peers, rows and fronts as data, and what an --only list selects (bench.targets),
the command line (bench.settings) and where a capacity level saturates (bench.refresh)."""

import pytest

from bench import refresh
from bench.paths import BENCH_DIR
from bench.settings import parse_args
from bench.targets import FRONT, FRONTS, GH_ROW, GROUPS, NGINX_ONLY_DEFAULT, PEER, PEERS, TARGET, TARGETS, select


def names(only):
    targets, nginx_only = select(only)
    return [t.name for t in targets], nginx_only


def test_every_name_the_data_uses_exists():
    for t in TARGETS:
        assert set(t.peers) <= set(PEER) and t.peers[0] == "nginx", t.name
        assert set(t.rows) <= set(GH_ROW), t.name
        assert set(t.fronts) <= set(FRONT), t.name
        assert t.kind in ("wrk", "direct", "footprint", "storm", "token", "capacity", "failover")
    for group in GROUPS.values():
        assert set(group) <= set(TARGET)
    assert set(NGINX_ONLY_DEFAULT) <= set(TARGET)
    for f in FRONTS:
        assert f.peer == "nginx" or f.peer in PEER


def test_every_template_and_fixture_is_there():
    for p in PEERS:
        assert (BENCH_DIR / p.template).is_file(), p.template
    for f in FRONTS:
        text = (BENCH_DIR / f.template).read_text()
        assert f"@{f.port}@" in text, f.name
    for t in TARGETS:
        assert t.expect.is_file() and (t.body is None or t.body.is_file()), t.name


def test_select_keeps_the_order_of_the_targets():
    assert names("tls,passthrough") == (["passthrough", "tls"], False)
    assert names("relay") == (["passthrough", "post", "tls"], False)
    assert names("sealed,bound") == (["sealed-sqlite", "sealed-pg", "dpop", "dpop-nonce"], False)
    assert names("all")[0] == GROUPS["all"]


def test_the_dpop_targets():
    """Both DPoP targets are in `bound` and `all`, after the bearer token they are compared with;
    only the instance-nonce one changes its instance's `dpop:` section and asks for nonces."""
    for group in ("bound", "all"):
        assert {"dpop", "dpop-nonce"} <= set(GROUPS[group])
        assert GROUPS[group].index("sealed-sqlite") < GROUPS[group].index("dpop") < GROUPS[group].index("dpop-nonce")
    store, nonce = TARGET["dpop"], TARGET["dpop-nonce"]
    assert store.dpop and not store.dpop_lines and not store.dpop_nonce and not store.profile_goals
    assert nonce.dpop and nonce.dpop_nonce and nonce.stack and not nonce.pg
    assert dict(line.split(": ") for line in nonce.dpop_lines) == {
        "replay_protection": "instance_nonce", "nonce_epoch": "10m", "replay_cache_entries": "2000000"}
    assert not TARGET["sealed-sqlite"].dpop


def test_every_profile_goal_is_a_goal():
    from bench.goals import GOALS
    ids = {g.id for g in GOALS}
    for t in TARGETS:
        assert set(t.profile_goals) <= ids, t.name
    assert TARGET["dpop-nonce"].profile_goals == ("dpop-nonce", "dpop-nonce-cpu")


def rendered_sealed(tmp_path, dpop_lines):
    """gatehouse-sealed.yaml.in rendered as bench.stack.start_sealed does (render refuses a placeholder left), parsed."""
    import yaml
    from bench.processes import render
    from bench.stack import dpop_section
    values = {"GATEHOUSE_PORT": 8080, "STORE": "sqlite_path: /tmp/x.sqlite", "KEYS_FILE": "/tmp/keys", "UPSTREAM_URL": "http://u",
              "TOKEN_ENDPOINT": "http://u/o/token/", "BACKEND_PORT": 8081, "DPOP": dpop_section(dpop_lines)}
    render(BENCH_DIR / "gatehouse-sealed.yaml.in", tmp_path / "g.yaml", values)
    return yaml.safe_load((tmp_path / "g.yaml").read_text())


def test_the_sealed_configuration_takes_a_targets_dpop_lines(tmp_path):
    assert rendered_sealed(tmp_path, ())["dpop"] == {"proof_lifetime": "300s"}
    nonce = rendered_sealed(tmp_path, TARGET["dpop-nonce"].dpop_lines)
    assert nonce["dpop"] == {"proof_lifetime": "300s", "replay_protection": "instance_nonce", "nonce_epoch": "10m",
                             "replay_cache_entries": 2000000}
    assert nonce["routes"][0]["prefix"] == "/api" and nonce["server"]["port"] == 8080  # the rest as it was


def test_select_nginx_only():
    assert names("nginx") == (["passthrough", "post", "tls", "direct"], True)  # NGINX_ONLY_DEFAULT in TARGETS' order
    assert set(NGINX_ONLY_DEFAULT) == {"direct", "passthrough", "post", "tls"}
    assert names("nginx,forward-auth") == (["forward-auth"], True)
    with pytest.raises(ValueError, match="does not go with token"):
        select("nginx,token")


@pytest.mark.parametrize("only, message", [("", "needs a list"), ("relay,", "needs a list"), ("nope", "unknown part 'nope'")])
def test_select_refuses(only, message):
    with pytest.raises(ValueError, match=message):
        select(only)


def test_parse_args():
    s = parse_args(["--no-build", "--only", "relay"], "usage")
    assert (s.only, s.build, s.args) == ("relay", False, ["--no-build", "--only", "relay"])
    assert parse_args(["--only=token"], "usage").only == "token"
    assert parse_args([], "usage").only == "all"


def test_parse_args_help_and_errors(capsys):
    with pytest.raises(SystemExit) as stop:
        parse_args(["--help"], "the usage\n")
    assert stop.value.code == 0 and capsys.readouterr().out == "the usage\n"
    with pytest.raises(SystemExit) as stop:
        parse_args(["--bogus"], "the usage")
    assert stop.value.code == 2 and "unknown argument '--bogus'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--only"], "the usage")


def level(waits, pg=0.5, gh=0.5, up=0.0, client=0.0):
    return {"waits": waits, "cpu_pg_cores": pg, "cpu_gh_cores": gh, "cpu_up_cores": up, "cpu_client_cores": client}


def test_saturation(monkeypatch):
    monkeypatch.setattr(refresh.os, "cpu_count", lambda: 2)
    assert refresh.saturation(level({"Lock": 25, "CPU": 60})) == "PostgreSQL locks"
    assert refresh.saturation(level({"CPU": 40, "IO": 15}, pg=1.2, gh=0.3)) == "PostgreSQL CPU"
    assert refresh.saturation(level({"CPU": 40, "IO": 15}, pg=0.3, gh=1.2)) == "PostgreSQL (active backends)"
    assert refresh.saturation(level({"idle": 60}, pg=0.1, gh=0.5)) == "Gatehouse (PostgreSQL backends mostly idle, waiting for it)"
    assert refresh.saturation(level({"idle": 60}, pg=0.2, gh=1.0, client=0.5)).endswith(
        "; the machine's CPU (1.7 of 2 cores busy, the load client included)")
    assert refresh.saturation(level({"CPU": 30, "idle": 30})) == "mixed"


def test_every_package_the_harness_installs_is_in_scripts_system_packages():
    """bench.tools installs through scripts/system-packages, which refuses a name in neither of its lists."""
    listed = (BENCH_DIR.parent / "scripts/system-packages").read_text()
    named = {p for t in TARGETS for p in t.packages}
    assert named >= {"etcd-server", "haproxy", "postgresql"}  # the failover target's
    for package in {p.package for p in PEERS} | {"nginx", "wrk", "openssl", "linux-perf", "postgresql", "postgresql-client"} | named:
        assert f'"{package}|' in listed, package
