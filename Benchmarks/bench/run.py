"""One run of the benchmark: its settings (the environment, checked), its state (the run's temp
dir, ports, processes, Results) and the order of its stages: tools, build, the backend and the
peers, then each selected target, then the report. `main` is Benchmarks/run."""

import contextlib
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from .paths import OUT_DIR, ROOT, RUNS_DIR
from .processes import Children, fail, free_ports, warn
from .settings import env_int, parse_args
from .stats import Results
from .targets import PEER, PEERS, TARGET, select
from . import failover, forward_auth, refresh, references, relay, report, stack, tools


class Run:
    """The run's settings (checked from the environment at once) and its state, which the stages
    (tools, references, gatehouse, rounds, the targets' modules, report) read and fill in."""

    def __init__(self, settings):
        self.s = settings
        try:
            self.targets, self.nginx_only = select(settings.only)
        except ValueError as error:
            fail(str(error))
        self.names = {t.name for t in self.targets}
        self.duration = env_int("DURATION", 10)
        self.rounds = env_int("ROUNDS", 3)
        self.warmup = env_int("WARMUP", 1, 0)
        self.pause_s = env_int("PAUSE", 1, 0)
        self.connections = env_int("CONNECTIONS", 64)
        self.threads = env_int("THREADS", 2)
        self.ready_timeout = env_int("READY_TIMEOUT", 60)
        self.storm_rounds = env_int("STORM_ROUNDS", 3)
        self.storm_workers = env_int("STORM_WORKERS", 250)
        self.storm_per_worker = env_int("STORM_PER_WORKER", 4)
        self.dpop_rate = env_int("DPOP_RATE", 8000)
        self.token_sequential = env_int("TOKEN_SEQUENTIAL", 200)
        self.token_concurrency = env_int("TOKEN_CONCURRENCY", 64)
        levels = os.environ.get("CAPACITY_LEVELS", "16,64,128")
        if not re.fullmatch(r"[1-9]\d*(,[1-9]\d*)*", levels):
            fail(f"CAPACITY_LEVELS must be a comma list of positive integers, not '{levels}'")
        self.capacity_levels = [int(x) for x in levels.split(",")]
        self.nginx_workers = os.environ.get("NGINX_WORKERS", "auto")
        if not re.fullmatch(r"auto|[1-9]\d*", self.nginx_workers):
            fail("NGINX_WORKERS must be auto or a number")
        self.peer_threads = os.cpu_count() if self.nginx_workers == "auto" else int(self.nginx_workers)
        self.metrics = os.environ.get("METRICS", "off")
        if self.metrics not in ("on", "off"):
            fail(f"METRICS must be on or off, not '{self.metrics}'")
        self.log_level = os.environ.get("GATEHOUSE_LOG_LEVEL", "")
        if self.log_level and self.log_level not in ("trace", "debug", "info", "notice", "warning", "error", "critical"):
            fail(f"GATEHOUSE_LOG_LEVEL: unknown level '{self.log_level}'")
        self.profile = os.environ.get("PROFILE", "")
        self.profile_hz = env_int("PROFILE_HZ", 999)
        if self.connections < self.threads:
            fail("CONNECTIONS must be at least THREADS (wrk needs a connection per thread)")
        peers = os.environ.get("PEERS", "haproxy,caddy")
        self.peer_names = ["nginx"] + ([] if peers == "none" else [p for p in peers.split(",") if p])
        for p in self.peer_names:
            if p not in PEER:
                fail(f"PEERS: unknown peer '{p}' (known: {', '.join(PEER)})")
        self.keep_tmp = os.environ.get("KEEP_TMP", "0") == "1"
        given = os.environ.get("GATEHOUSE_BIN", "")
        self.bin_given = bool(given)
        self.bin = self.abs(given or ".build/release/gatehouse")
        base = os.environ.get("BASELINE_BIN", "")
        self.baseline = None
        if base:
            if not self.names & {"passthrough", "token"} or self.nginx_only:
                fail(f"BASELINE_BIN needs the passthrough or the token target (--only passthrough, relay, token or all), "
                     f"not --only {settings.only}")
            self.baseline = self.abs(base)
            if not (self.baseline.is_file() and os.access(self.baseline, os.X_OK)):
                fail(f"BASELINE_BIN: no executable file at {self.baseline}")
        self.needs_gatehouse = not self.nginx_only and any(t.kind != "direct" for t in self.targets)
        self.needs_stack = any(t.stack for t in self.targets)
        self.needs_pg = any(t.pg for t in self.targets)
        self.needs_wrk = True   # bench.tools: whether a selected target runs wrk
        self.children = Children()
        self.contexts = contextlib.ExitStack()  # what runs in a `with` (the upstream: sandbox.dot.run)
        self.results = Results()
        self.run_dir = None
        self.pg_parent = None
        self.pg_dir = None
        self.binary_problem = ""
        self.stack_failed = ""
        self.versions = {}
        self.peer_procs = {}    # name -> Popen
        self.peer_ports = {}    # name -> (port, tls port)
        self.nginx_auth_request = False
        self.fa_cache = None

    def abs(self, path):
        """A path relative to the repository made absolute."""
        p = Path(path)
        return p if p.is_absolute() else ROOT / p

    def rel(self, path):
        """A path as the report shows it: relative to the repository when inside it."""
        text = str(path)
        return text[len(str(ROOT)) + 1:] if text.startswith(str(ROOT) + "/") else text

    def main(self):
        """The stages in order: tools, build, backend and peers, each selected target, the report."""
        tools.tools(self)
        tools.build(self)
        self.run_dir = Path(tempfile.mkdtemp(prefix="gatehouse-bench.", dir=os.environ.get("TMPDIR", "/tmp")))
        shutil.rmtree(RUNS_DIR, ignore_errors=True)
        for old in list(OUT_DIR.glob("storm-*.json")) + list(OUT_DIR.glob("wrk-*.txt")):
            old.unlink()
        (RUNS_DIR / "warmup").mkdir(parents=True, exist_ok=True)
        ports = free_ports(9 + 2 * len(PEERS))
        (self.port_a, self.port_at, self.port_c, self.port_ct, self.port_s1, self.port_s2, self.port_s3) = ports[:7]
        for i, peer in enumerate(PEERS):
            self.peer_ports[peer.name] = (ports[9 + 2 * i], ports[10 + 2 * i])
        self.token = secrets.token_urlsafe(24)
        self.shown_token = ""
        self.gh_env = dict(os.environ, BENCH_UPSTREAM_SECRET=secrets.token_urlsafe(24),
                           BENCH_SEALED_SECRET=secrets.token_urlsafe(24))
        self.identity_log = self.run_dir / "identity-access.log"
        self.pg_host = ""
        self.pg_statements = False
        self.counts_url = None
        references.start_backend(self)
        references.start_peers(self)
        if "direct" in self.names:
            relay.direct(self)
        relay.relay_targets(self)
        if "forward-auth" in self.names:
            forward_auth.forward_auth_target(self)
        if "footprint" in self.names:
            relay.footprint(self)
        if self.needs_stack:
            self.stack_failed = stack.start_stack(self)
            if self.stack_failed:
                warn(f"sealed set-up: {self.stack_failed}")
        for name in ("sealed-sqlite", "dpop", "dpop-nonce"):  # the bearer token first: the DPoP goals compare with it
            if name in self.names:
                (self.run_dir / name).mkdir()
                p = stack.sealed_target(self, TARGET[name], name, self.port_s3, f"sqlite_path: {self.run_dir}/{name}/gatehouse.sqlite")
                self.children.stop(p)
        sealed1 = None
        if "sealed-pg" in self.names:
            sealed1 = stack.sealed_target(self, TARGET["sealed-pg"], "sealed-pg", self.port_s1,
                                         stack.pg_store(self) if not self.stack_failed else "")
        if "storm" in self.names:
            sealed1 = stack.storm(self, sealed1)
        if sealed1:
            self.children.stop(sealed1)
        if "token" in self.names:
            refresh.token_target(self)
        if "capacity" in self.names:
            refresh.capacity_target(self)
        if "failover" in self.names:
            failover.failover_target(self)
        report.write_report(self)

    def cleanup(self):
        """Stops everything the run started and removes its temp folders (KEEP_TMP=1 keeps them)."""
        self.contexts.close()
        self.children.stop_all()
        if self.pg_dir:
            subprocess.run([str(ROOT / "scripts/postgres"), "stop", str(self.pg_dir)])
        if self.pg_parent and self.pg_parent.exists():
            if self.keep_tmp:
                warn(f"kept {self.pg_parent} (PostgreSQL stopped)")
            else:
                shutil.rmtree(self.pg_parent, ignore_errors=True)
        if self.fa_cache and self.fa_cache.exists():
            shutil.rmtree(self.fa_cache, ignore_errors=True)
        if self.run_dir and self.run_dir.exists():
            if self.keep_tmp:
                warn(f"kept {self.run_dir}")
            else:
                shutil.rmtree(self.run_dir, ignore_errors=True)


def main(usage):
    """Benchmarks/run: the arguments, the run, and its cleanup whatever happens (TERM and Ctrl-C too)."""
    settings = parse_args(sys.argv[1:], usage)
    run = Run(settings)

    def on_signal(signum, _frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    try:
        os.chdir(ROOT)
        run.main()
    except KeyboardInterrupt:
        sys.exit(130)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        run.cleanup()
