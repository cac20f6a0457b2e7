"""The sealed stack: PostgreSQL (scripts/postgres), the upstream (the real django-oauth-toolkit
server) behind the counting token proxy, sealed Gatehouse instances, the sign-ins (sealed.py with
the venv), and the sealed targets and the refresh storm that run on it."""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .paths import BENCH_DIR, DATA, OUT_DIR, ROOT, SEALED_PY
from .processes import log_tail, pause, render, say, wait_for_line, warn
from . import gatehouse, references, rounds

from sandbox import dot, gatehouse as gatehouse_process  # the repository root is on sys.path (Benchmarks/run)

TOKEN_PROXY = ROOT / "sandbox/tokenproxy.py"  # the counting proxy, run with the venv (it needs requests)


def psql(ctx, sql, check_rc=True):
    """One SQL statement on the run's PostgreSQL, its output; RuntimeError when it fails (check_rc)."""
    r = subprocess.run(["psql", "-h", ctx.pg_host, "-p", str(ctx.pg_port), "-U", "gatehouse", "-d", "gatehouse",
                        "-v", "ON_ERROR_STOP=1", "-tAc", sql], capture_output=True, text=True)
    if check_rc and r.returncode:
        raise RuntimeError(f"psql: {r.stderr.strip()}")
    return r.stdout.strip()


def start_stack(ctx):
    """The sealed stack: the venv, PostgreSQL (when a target needs it), the session keys, the upstream
    and the counting token proxy. "" or why it could not start."""
    if ctx.binary_problem:
        return ctx.binary_problem
    keys = subprocess.run([str(ctx.bin), "--help"], capture_output=True, text=True)
    if not re.search(r"^ +keys ", keys.stdout + keys.stderr, re.M):
        return f"{ctx.rel(ctx.bin)} has no 'keys' subcommand (built before sealed sessions): rebuild it"
    say("preparing the Python venv (scripts/python-env)")
    venv = subprocess.run([str(ROOT / "scripts/python-env")], stdout=subprocess.PIPE, text=True)
    if venv.returncode:
        return "scripts/python-env failed"
    ctx.venv_py = str(Path(venv.stdout.strip().splitlines()[-1]) / "bin/python")
    ctx.versions["dot"] = subprocess.run([ctx.venv_py, "-c", "import oauth2_provider; print(oauth2_provider.__version__)"],
                                          capture_output=True, text=True).stdout.strip() or "?"
    if ctx.needs_pg:
        if not shutil.which("psql"):
            return "psql is missing (apt-get install postgresql-client)"
        ctx.pg_parent = Path(tempfile.mkdtemp(prefix="gatehouse-bench-pg.", dir="/tmp"))
        os.chmod(ctx.pg_parent, 0o755)
        ctx.pg_dir = ctx.pg_parent / "pg"
        say(f"starting PostgreSQL: scripts/postgres start {ctx.pg_dir} (pg_stat_statements preloaded, log_statement=none)")
        env = dict(os.environ, POSTGRES_OPTIONS="-c shared_preload_libraries=pg_stat_statements -c log_statement=none "
                                                "-c track_io_timing=off")
        r = subprocess.run([str(ROOT / "scripts/postgres"), "start", str(ctx.pg_dir)], stdout=subprocess.PIPE, text=True, env=env)
        if r.returncode:
            log_tail(ctx.pg_dir / "server.log")
            return "scripts/postgres start failed"
        ctx.pg_host, _, port = r.stdout.strip().rpartition(":")
        ctx.pg_port = int(port)
        ctx.versions["postgresql"] = (psql(ctx, "SHOW server_version", False) or "?").split()[0]
        try:
            psql(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            ctx.pg_statements = True
        except RuntimeError as error:
            warn(f"pg_stat_statements is not available ({error}); the capacity table counts from pg_stat_database")
            ctx.pg_statements = False
        say(f"PostgreSQL {ctx.versions['postgresql']} on {ctx.pg_host}:{ctx.pg_port}")
    try:
        gatehouse_process.generate_keys(ctx.run_dir / "session-keys", binary=ctx.bin)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, RuntimeError) as error:
        print(getattr(error, "stderr", None) or error, file=sys.stderr)
        return "gatehouse keys generate failed"
    rendered = ctx.run_dir / "upstream.json.rendered"
    render(BENCH_DIR / "upstream.json.in", rendered,
           {"SEALED_PORT_1": ctx.port_s1, "SEALED_PORT_2": ctx.port_s2, "SEALED_PORT_3": ctx.port_s3})
    say(f"starting the upstream (django-oauth-toolkit {ctx.versions['dot']}): sandbox/dot/serve.py --port 0 --quiet")
    try:
        upstream = ctx.contexts.enter_context(dot.run(ctx.run_dir, "upstream", json.loads(rendered.read_text()),
                                                      env=ctx.gh_env, python=ctx.venv_py))
    except RuntimeError as error:
        warn(str(error))
        return "the upstream did not print its ready line"
    ctx.upstream, ctx.upstream_url = upstream.process, upstream.url
    say(f"upstream at {ctx.upstream_url} (pid {ctx.upstream.pid})")
    out = ctx.run_dir / "token-proxy.out"
    with open(out, "wb") as o, open(ctx.run_dir / "token-proxy.log", "wb") as e:
        ctx.token_proxy = ctx.children.spawn([ctx.venv_py, str(TOKEN_PROXY), "--target", f"{ctx.upstream_url}/o/token/"],
                                             stdout=o, stderr=e)
    line = wait_for_line(out, '"ready"', ctx.token_proxy, 10)
    if not line:
        log_tail(ctx.run_dir / "token-proxy.log")
        return "the token proxy did not start"
    ctx.token_proxy_url = json.loads(line)["url"]
    ctx.counts_url = ctx.token_proxy_url.removesuffix("/o/token/") + "/_counts"
    say(f"counting token proxy (sandbox/tokenproxy.py) at {ctx.token_proxy_url} (pid {ctx.token_proxy.pid})")
    return ""


def pg_store(ctx):
    """The `store:` line of an instance on the run's PostgreSQL."""
    return f"postgres: {{host: {ctx.pg_host}, port: {ctx.pg_port}, database: gatehouse, username: gatehouse}}"


def dpop_section(lines):
    """The DPOP placeholder of gatehouse-sealed.yaml.in: further lines of its `dpop:` section."""
    return "".join(f"  {line}\n" for line in lines)


def start_sealed(ctx, name, port, store, targets, direct_token_endpoint=False, dpop_lines=(), binary=None):
    """A sealed instance (gatehouse-sealed.yaml.in; dpop_lines: further lines of its `dpop:`
    section), its token endpoint the counting proxy or, with direct_token_endpoint, the upstream's
    own; binary: another gatehouse than the run's (BASELINE_BIN): (Popen, "") or (None, why not)."""
    if ctx.stack_failed:
        return None, f"sealed set-up: {ctx.stack_failed}"
    conf = ctx.run_dir / f"gatehouse-{name}.yaml"
    render(BENCH_DIR / "gatehouse-sealed.yaml.in", conf, references.values(ctx,
        GATEHOUSE_PORT=port, STORE=store, KEYS_FILE=ctx.run_dir / "session-keys", UPSTREAM_URL=ctx.upstream_url,
        TOKEN_ENDPOINT=f"{ctx.upstream_url}/o/token/" if direct_token_endpoint else ctx.token_proxy_url,
        DPOP=dpop_section(dpop_lines)))
    if dpop_lines:
        refused = gatehouse.config_refused(ctx, binary or ctx.bin, conf, ("dpop", "replay_protection", "nonce_epoch"))
        if refused:
            return None, f"skipped: this binary refuses the configuration ({refused})"
    return gatehouse.start_gatehouse(ctx, name, binary or ctx.bin, conf, port, targets)


def sign_in(ctx, name, port, out, *extra):
    """One sealed sign-in (alice) through an instance; its access token written to `out`."""
    r = subprocess.run([ctx.venv_py, str(SEALED_PY), "sign-in", f"http://127.0.0.1:{port}", str(out), *extra],
                       stdout=sys.stderr)
    if r.returncode:
        warn(f"gatehouse '{name}': the sign-in (alice, sealed) failed; last 30 lines of its log:")
        log_tail(ctx.run_dir / f"gatehouse-{name}.log")
        return False
    return True


def sign_in_many(ctx, port, count, client_id, redirect, out):
    """`count` sign-ins through an instance: their tokens (a refresh chain each), or None."""
    r = subprocess.run([ctx.venv_py, str(SEALED_PY), "sign-in-many", f"http://127.0.0.1:{port}", str(out),
                        "--count", str(count), "--client-id", client_id, "--redirect-uri", redirect, "--threads", "4"],
                       stdout=sys.stderr)
    if r.returncode:
        return None
    return [json.loads(line) for line in Path(out).read_text().splitlines() if line.strip()]


def sealed_target(ctx, target, name, port, store):
    """A sealed target (sealed-sqlite, sealed-pg, dpop, dpop-nonce): its instance, the sign-in (for
    a DPoP target: bound to a key, the instance's nonce when it requires one, and the proofs), then
    the rounds. Returns the instance, still running (the storm may use it)."""
    sides = references.reference_sides(ctx, target)
    p, reason = start_sealed(ctx, name, port, store, target.label, dpop_lines=target.dpop_lines)
    make_proofs = None
    header = None
    if p:
        key = ctx.run_dir / f"{name}-dpop-key.pem"
        options = ["--dpop-key", str(key)] if target.dpop else []
        if not sign_in(ctx, name, port, ctx.run_dir / f"{name}-token", *options):
            reason = "the sign-in (alice, sealed) failed"
        else:
            bearer = (ctx.run_dir / f"{name}-token").read_text().strip()
            ctx.shown_token = bearer
            header = f"Authorization: {'DPoP' if target.dpop else 'Bearer'} {bearer}"
            if target.dpop:
                url = f"http://127.0.0.1:{port}/api/data"
                nonce_of = (lambda: fetch_nonce(ctx, name, key, bearer, url)) if target.dpop_nonce else None
                make_proofs = ProofFiles(ctx, key, bearer, url, ctx.run_dir / f"{name}-proofs", nonce_of)
                for run_name in ["warmup"] + [str(i) for i in range(1, ctx.rounds + 1)]:
                    if not make_proofs(run_name):
                        reason = make_proofs.problem
                        break
            else:
                reason = gatehouse.warm_up(ctx, name, port, "/api", bearer)
        if reason:
            ctx.children.stop(p)
            p = None
    side = gatehouse.gh_side(ctx, "gatehouse", p, reason, f"http://127.0.0.1:{port}/api/data", name, header=header,
                             proofs=make_proofs, counts=ctx.counts_url if not ctx.stack_failed else None)
    rounds.run_target(ctx, target, sides + [side])
    return p


def fetch_nonce(ctx, name, key, bearer, url):
    """The instance's DPoP nonce (sealed.py nonce: the DPoP-Nonce of the 401 to a proof without
    one): (nonce, "") or ("", why not)."""
    r = subprocess.run([ctx.venv_py, str(SEALED_PY), "nonce", "--key", str(key), "--token", bearer, "--url", url],
                       stdout=subprocess.PIPE, text=True)
    value = r.stdout.strip()
    if r.returncode or not value:
        warn(f"gatehouse '{name}': no DPoP nonce from a proof without one; last 30 lines of its log:")
        log_tail(ctx.run_dir / f"gatehouse-{name}.log")
        return "", "the instance gave no DPoP-Nonce (a 401 use_dpop_nonce) to a proof without one"
    say(f"gatehouse '{name}': its DPoP nonce ({len(value)} characters) goes in the proofs of the next run")
    return value, ""


class ProofFiles:
    """The proofs of a DPoP target, one file per run (`{base}-{run name}`), each proof used once:
    made by sealed.py proofs, DPOP_RATE per second of the run and 2 s more, their jti numbers
    never overlapping between files; nonce_of: for an instance that requires its nonce, how to
    get a current one ((nonce, "") or ("", why not)), asked for each file. Called with a run name:
    the file, made on the first call, or None (`problem` says why)."""

    def __init__(self, ctx, key, bearer, url, base, nonce_of=None):
        self.ctx, self.key, self.bearer, self.url, self.base, self.nonce_of = ctx, key, bearer, url, base, nonce_of
        self.first = 0
        self.made = {}
        self.problem = ""

    def __call__(self, run_name):
        if run_name in self.made:
            return self.made[run_name]
        ctx = self.ctx
        self.made[run_name] = None
        nonce = ""
        if self.nonce_of:
            nonce, self.problem = self.nonce_of()
            if self.problem:
                return None
        count = ((ctx.warmup if run_name == "warmup" else ctx.duration) + 2) * ctx.dpop_rate
        out = f"{self.base}-{run_name}"
        r = subprocess.run([ctx.venv_py, str(SEALED_PY), "proofs", "--key", str(self.key), "--token", self.bearer, "--url", self.url,
                            "--count", str(count), "--first", str(self.first), "--out", out]
                           + (["--nonce", nonce] if nonce else []), stdout=sys.stderr)
        self.first += count
        if r.returncode:
            self.problem = "the DPoP proofs could not be made"
            return None
        self.made[run_name] = out
        return out


def storm(ctx, sealed1):
    """The refresh storm: two sealed instances on one PostgreSQL, STORM_ROUNDS storms on an expired
    upstream token, then a control storm. Returns instance 1 (to be stopped by the caller)."""
    r = ctx.results
    if ctx.stack_failed:
        r.storm_failed = ctx.stack_failed
        return sealed1
    if not sealed1 or sealed1.poll() is not None:
        sealed1, reason = start_sealed(ctx, "sealed-pg", ctx.port_s1, pg_store(ctx), "refresh storm")
        if reason:
            r.storm_failed = f"sealed instance 1: {reason}"
            return sealed1
    sealed2, reason = start_sealed(ctx, "sealed-pg-2", ctx.port_s2, pg_store(ctx), "refresh storm")
    if reason:
        r.storm_failed = f"sealed instance 2: {reason}"
        return sealed1
    ctx.storm_procs = [sealed1, sealed2]
    if not sign_in(ctx, "sealed-pg", ctx.port_s1, ctx.run_dir / "storm-token"):
        r.storm_failed = "the sign-in (alice, sealed) failed"
    # No warm-up: the session must not be in either instance's 10 s session cache when a storm starts.
    for round_ in range(1, ctx.storm_rounds + 1):
        if r.storm_failed:
            break
        if round_ > 1:
            say("waiting 11 s for the instances' session caches (10 s) to forget the last storm")
            pause(11)
        try:
            psql(ctx, "UPDATE sessions SET upstream_expires_at = 0")
        except RuntimeError as error:
            r.storm_failed = f"psql could not expire the upstream token: {error}"
            break
        say(f"storm {round_}: {ctx.storm_workers * ctx.storm_per_worker} requests from {ctx.storm_workers} threads across both instances")
        fire_storm(ctx, str(round_), str(round_), 1)
    if not r.storm_failed:
        say("waiting 11 s, then the control storm (upstream token not expired: no refresh expected)")
        pause(11)
        fire_storm(ctx, "control", "control (not expired)", 0)
    if r.storm_failed:
        warn(f"storm: {r.storm_failed}")
        for name in ("sealed-pg", "sealed-pg-2"):
            warn(f"last 15 lines of gatehouse-{name}.log:")
            log_tail(ctx.run_dir / f"gatehouse-{name}.log", 15)
    ctx.children.stop(sealed2)
    return sealed1


def fire_storm(ctx, name, label, expected):
    """One storm (sealed.py storm), its summary kept in the results."""
    out = OUT_DIR / f"storm-{name}.json"
    rc = subprocess.run([ctx.venv_py, str(SEALED_PY), "storm", "--url", f"http://127.0.0.1:{ctx.port_s1}",
                         "--url", f"http://127.0.0.1:{ctx.port_s2}", "--token-file", str(ctx.run_dir / "storm-token"),
                         "--counts", ctx.counts_url, "--workers", str(ctx.storm_workers), "--per-worker", str(ctx.storm_per_worker),
                         "--path", "/api/data", "--expect-body", str(DATA), "--identity-log", str(ctx.identity_log),
                         "--label", label, "--expect-refresh-grants", str(expected), "--out", str(out)], stdout=sys.stderr).returncode
    if rc:
        warn(f"storm {name}: the storm script failed")
    ctx.results.storm_files.append(out)
    try:
        ctx.results.storms.append(json.loads(out.read_text()))
    except (OSError, ValueError):
        pass
    try:
        version = psql(ctx, "SELECT version FROM sessions ORDER BY created_at DESC, version DESC LIMIT 1")
    except RuntimeError:
        version = "?"
    ctx.results.storm_versions.append(version or "?")
    for i, p in enumerate(ctx.storm_procs, 1):
        if p.poll() is not None:
            ctx.results.storm_failed = f"sealed gatehouse {i} exited during storm {name}"
