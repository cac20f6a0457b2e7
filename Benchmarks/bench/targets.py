"""The benchmark as data: the targets (`--only` names and groups), the reference proxies (PEERS),
the extra Gatehouse rows (GH_ROWS) and the forward-auth fronts (FRONTS). A new target, peer, row
or front is an entry here (and, for a peer or a front, its configuration template in Benchmarks/);
the goals are in goals.py."""

from dataclasses import dataclass
from pathlib import Path

from .paths import DATA, POST_ANSWER, POST_BODY


@dataclass(frozen=True)
class Target:
    """One `--only` name. kind: wrk (interleaved wrk rounds against references), direct, footprint,
    storm, token, capacity, failover (the end-to-end failover test run with the harness's binary)."""
    name: str
    label: str
    kind: str = "wrk"
    instance: str = ""            # the Gatehouse instance it measures (wrk targets)
    path: str = "/api/data"       # Gatehouse's side
    ref_path: str = "/api/data"   # the references' side
    tls: bool = False             # the references' TLS port (nginx only)
    method: str | None = None
    body: Path | None = None
    expect: Path = DATA
    ratio: float | None = None    # the goal's requests/s ratio to nginx (None: reported only)
    p99_ms: float | None = None   # the goal's p99 margin over nginx
    peers: tuple = ("nginx",)     # reference rows, in their order in each round
    rows: tuple = ()              # extra Gatehouse rows (GH_ROWS names) measured in the same rounds
    stack: bool = False           # needs the upstream, the venv, the token proxy
    pg: bool = False              # needs PostgreSQL
    gatehouse_only: bool = False  # has no reference side (not with --only nginx)
    fronts: tuple = ()            # forward-auth fronts (FRONTS names) measured in the same rounds
    dpop: bool = False            # a DPoP-bound token (ghd_) and a fresh proof per request, made beforehand
    dpop_lines: tuple = ()        # lines under `dpop:` added to its instance's configuration
    dpop_nonce: bool = False      # its proofs carry the instance's nonce (fetched from a 401 after the sign-in)
    profile_goals: tuple = ()     # goal ids: when one is missed, an extra run under perf (not counted) is profiled
    packages: tuple = ()          # Debian packages it needs (scripts/system-packages names), installed when missing
    what: str = ""


TARGETS = [
    Target("passthrough", "passthrough GET", instance="passthrough", ratio=0.80, p99_ms=1.0,
           peers=("nginx", "haproxy", "caddy"), rows=("baseline", "access-log-off"),
           what="`GET /api/data`, passthrough token, warm identity cache, SQLite store"),
    Target("post", "POST 2 KiB JSON", instance="passthrough", path="/api/post", ref_path="/api/post", method="POST",
           body=POST_BODY, expect=POST_ANSWER, ratio=0.70, peers=("nginx", "haproxy", "caddy"),
           what="`POST /api/post` with a 2,048-byte JSON body, passthrough token"),
    Target("tls", "https backend", instance="https", path="/tls/data", tls=True, ratio=0.70,
           what="`GET /tls/data` -> https backend (self-signed, `backend_ca_file`)"),
    Target("forward-auth", "forward auth", instance="forward-auth", fronts=("nginx-auth", "nginx-auth-cached", "caddy-auth"),
           what="`GET /api/data` through nginx `auth_request` / Caddy `forward_auth` asking Gatehouse's `/forward-auth`"),
    Target("sealed-sqlite", "sealed, SQLite", instance="sealed-sqlite", ratio=0.75, stack=True,
           what="`GET /api/data`, sealed `gha_` token, `store: sqlite`"),
    Target("sealed-pg", "sealed, PostgreSQL", instance="sealed-pg", ratio=0.75, stack=True, pg=True,
           what="`GET /api/data`, sealed `gha_` token, `store: postgres`"),
    Target("dpop", "DPoP-bound, SQLite", instance="dpop", stack=True, dpop=True,
           what="`GET /api/data`, `ghd_` token bound to an ES256 key, a fresh proof per request (replay protection: the store)"),
    Target("dpop-nonce", "DPoP-bound, instance nonces, SQLite", instance="dpop-nonce", stack=True, dpop=True,
           dpop_lines=("replay_protection: instance_nonce", "nonce_epoch: 10m", "replay_cache_entries: 2000000"),
           dpop_nonce=True, profile_goals=("dpop-nonce", "dpop-nonce-cpu"),
           what="`GET /api/data`, `ghd_` token bound to an ES256 key, a fresh proof per request carrying the instance's nonce "
                "(replay protection: the instance's own jti set, no store write)"),
    Target("footprint", "identity cache, 1 M entries", kind="footprint", gatehouse_only=True),
    Target("storm", "refresh storm", kind="storm", stack=True, pg=True, gatehouse_only=True),
    Target("token", "token endpoint overhead", kind="token", stack=True, pg=True, gatehouse_only=True),
    Target("capacity", "sealed refresh capacity", kind="capacity", stack=True, pg=True, gatehouse_only=True),
    Target("failover", "PostgreSQL failover", kind="failover", gatehouse_only=True,
           packages=("etcd-server", "haproxy", "postgresql"),
           what="Tests/EndToEnd/test_postgres_failover.py with the release binary: two instances through a Patroni "
                "switchover and failover, synchronous and asynchronous"),
    Target("direct", "nginx direct", kind="direct"),
]


TARGET = {t.name: t for t in TARGETS}


GROUPS = {
    "relay": ["passthrough", "post", "tls"],
    "sealed": ["sealed-sqlite", "sealed-pg"],
    "bound": ["sealed-sqlite", "dpop", "dpop-nonce"],
    "all": ["passthrough", "post", "tls", "forward-auth", "sealed-sqlite", "sealed-pg", "dpop", "dpop-nonce", "footprint", "storm",
            "token", "capacity"],
}


NGINX_ONLY_DEFAULT = ["direct", "passthrough", "post", "tls"]


@dataclass(frozen=True)
class Peer:
    """A reference proxy in front of the same nginx backend. Its config template gets @PEER_PORT@
    (and @PEER_TLS_PORT@), @BACKEND_PORT@, @BACKEND_TLS_PORT@, @RUN_DIR@, @PEER_THREADS@
    (NGINX_WORKERS as a number), @NGINX_WORKERS@. command: its argv ({binary}, {conf}, {dir});
    cpu: how its processes are found for CPU accounting ("tree": the started process and every
    process below it, e.g. nginx's master and workers; "process": the started process alone)."""
    name: str
    label: str
    package: str
    binaries: tuple               # the executable: the first found (name on PATH or absolute)
    template: str
    command: tuple
    version: tuple
    env: tuple = ()               # (NAME, value with {dir} / {threads})
    cpu: str = "tree"
    tls: bool = False             # also listens on @PEER_TLS_PORT@ (proxying to the https backend)
    optional: bool = True         # the run goes on without it (with a note) when it cannot start


PEERS = [
    Peer("nginx", "nginx", "nginx", ("nginx", "/usr/sbin/nginx"), "nginx-proxy.conf.in",
         ("{binary}", "-p", "{dir}", "-c", "{conf}", "-e", "{dir}/proxy-error.log", "-g", "daemon off;"),
         ("{binary}", "-v"), tls=True, optional=False),
    Peer("haproxy", "HAProxy", "haproxy", ("haproxy", "/usr/sbin/haproxy"), "haproxy.cfg.in",
         ("{binary}", "-db", "-f", "{conf}"), ("{binary}", "-v")),
    Peer("caddy", "Caddy", "caddy", ("caddy", "/usr/bin/caddy"), "Caddyfile.in",
         ("{binary}", "run", "--config", "{conf}", "--adapter", "caddyfile"), ("{binary}", "version"),
         env=(("XDG_DATA_HOME", "{dir}/caddy-data"), ("XDG_CONFIG_HOME", "{dir}/caddy-config"),
              ("HOME", "{dir}"), ("GOMAXPROCS", "{threads}"))),
]


PEER = {p.name: p for p in PEERS}


@dataclass(frozen=True)
class GatehouseRow:
    """An extra Gatehouse row of a wrk target, measured in the same rounds (its own instance)."""
    name: str
    label: str
    observability: tuple = ()     # lines under `observability:` added to the instance's config
    baseline: bool = False        # runs BASELINE_BIN (only when set)


GH_ROWS = [
    GatehouseRow("baseline", "baseline binary", baseline=True),
    GatehouseRow("access-log-off", "access log off", observability=("access_log: off",)),
]


GH_ROW = {r.name: r for r in GH_ROWS}


@dataclass(frozen=True)
class Front:
    """A row of the forward-auth target: a proxy in front of the same nginx backend that asks
    Gatehouse's `/forward-auth` before each request. peer: what runs it ("nginx", or a PEERS entry
    whose binary, command line, environment and version it borrows; skipped, as that peer's rows
    are, when it is not installed or not in PEERS); template: its configuration (fronts with one
    template share one process); port: its port's placeholder in that template. Its CPU is its
    process tree's plus Gatehouse's, the two also reported apart."""
    name: str
    label: str
    peer: str
    template: str
    port: str
    cached: bool = False


FRONTS = [
    Front("nginx-auth", "nginx + auth_request → Gatehouse (uncached)", "nginx", "nginx-forward-auth.conf.in", "FA_PORT"),
    Front("nginx-auth-cached", "nginx + auth_request → Gatehouse, cached (proxy_cache, max_age 5 s)", "nginx",
          "nginx-forward-auth.conf.in", "FA_CACHED_PORT", cached=True),
    Front("caddy-auth", "Caddy + forward_auth → Gatehouse", "caddy", "Caddyfile-forward-auth.in", "FA_CADDY_PORT"),
]


FRONT = {f.name: f for f in FRONTS}


FA_MAX_AGE = "5s"                 # forward_auth.max_age of the target's instance (the cached row's bound)


FA_CACHED_RATIO = 0.85            # the cached nginx front's goal, × nginx alone


def select(only):
    """The targets an --only list names, in TARGETS' order, and whether it is the nginx-only trial;
    raises ValueError (the message for the user) on an unknown or impossible list."""
    parts = [p for p in only.split(",")]
    if not parts or any(not p for p in parts):
        raise ValueError("--only needs a list (see --help)")
    selected, nginx_only = set(), False
    for part in parts:
        if part in GROUPS:
            selected.update(GROUPS[part])
        elif part == "nginx":
            nginx_only = True
        elif part in TARGET:
            selected.add(part)
        else:
            raise ValueError(f"--only: unknown part '{part}' (see --help)")
    if nginx_only:
        if not selected:
            selected = set(NGINX_ONLY_DEFAULT)
        for name in selected:
            t = TARGET[name]
            if t.gatehouse_only or t.stack:
                raise ValueError(f"--only nginx measures no Gatehouse: it does not go with {name}")
    return [t for t in TARGETS if t.name in selected], nginx_only
