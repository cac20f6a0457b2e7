"""The report: its header (command, machine, commit, binaries, software, load), the sections of
the targets that ran (tables.py), the storms, the profiles and the goals; printed and written to
.build/benchmarks/latest.md."""

import datetime
import hashlib
import os
import subprocess
import sys
from pathlib import Path

from .goals import goals_table
from .paths import REPORT, ROOT, RUNS_DIR, SEALED_PY
from .processes import say
from . import failover, tables


def command_line(ctx):
    """The command that reproduces this run: the environment variables that differ from their defaults."""
    parts = []
    env = [("GATEHOUSE_BIN", ctx.rel(ctx.bin) if ctx.bin_given else None), ("BASELINE_BIN", ctx.rel(ctx.baseline) if ctx.baseline else None),
           ("METRICS", "on" if ctx.metrics == "on" else None), ("GATEHOUSE_LOG_LEVEL", ctx.log_level or None),
           ("PEERS", os.environ.get("PEERS")),
           ("STORM_ROUNDS", None if (ctx.storm_rounds, ctx.storm_workers, ctx.storm_per_worker) == (3, 250, 4) else ctx.storm_rounds),
           ("STORM_WORKERS", None if (ctx.storm_rounds, ctx.storm_workers, ctx.storm_per_worker) == (3, 250, 4) else ctx.storm_workers),
           ("STORM_PER_WORKER", None if (ctx.storm_rounds, ctx.storm_workers, ctx.storm_per_worker) == (3, 250, 4) else ctx.storm_per_worker),
           ("NGINX_WORKERS", None if ctx.nginx_workers == "auto" else ctx.nginx_workers),
           ("THREADS", None if ctx.threads == 2 else ctx.threads), ("CONNECTIONS", None if ctx.connections == 64 else ctx.connections),
           ("PAUSE", None if ctx.pause_s == 1 else ctx.pause_s), ("WARMUP", None if ctx.warmup == 1 else ctx.warmup),
           ("ROUNDS", None if ctx.rounds == 3 else ctx.rounds),
           ("TOKEN_SEQUENTIAL", None if ctx.token_sequential == 200 else ctx.token_sequential),
           ("TOKEN_CONCURRENCY", None if ctx.token_concurrency == 64 else ctx.token_concurrency),
           ("CAPACITY_LEVELS", None if ctx.capacity_levels == [16, 64, 128] else ",".join(map(str, ctx.capacity_levels))),
           ("DURATION", ctx.duration)]
    for k, v in env:
        if v is not None:
            parts.append(f"{k}={v}")
    return " ".join(parts + ["Benchmarks/run"] + ctx.s.args)


def describe_bin(ctx, path):
    """A binary as the report names it: its path, sha256 prefix and modification time."""
    try:
        digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()[:12]
        when = datetime.datetime.fromtimestamp(Path(path).stat().st_mtime, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    except OSError:
        digest, when = "?", "?"
    return f"`{ctx.rel(path)}` (sha256 {digest}…, modified {when})"


def write_report(ctx):
    """The report: printed, and written to .build/benchmarks/latest.md."""
    r = ctx.results
    out = []
    add = out.append
    add("## Gatehouse relay vs nginx, HAProxy and Caddy")
    add("")
    add(f"- command: `{command_line(ctx)}`")
    add(f"- date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}")
    model = next((l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines() if l.startswith("model name")), "?")
    mem = next((int(l.split()[1]) for l in Path("/proc/meminfo").read_text().splitlines() if l.startswith("MemTotal:")), 0)
    osname = next((l.split("=", 1)[1].strip('"') for l in Path("/etc/os-release").read_text().splitlines() if l.startswith("PRETTY_NAME=")), "?")
    add(f"- machine: {os.cpu_count()} cores ({model}), {mem / 1048576:.1f} GiB RAM, {osname}, Linux {os.uname().release}")
    rev = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip() or "?"
    if subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True).stdout.strip():
        rev += " (with uncommitted changes)"
    add(f"- commit: {rev}")
    if ctx.needs_gatehouse:
        add(f"- binary: gatehouse {describe_bin(ctx, ctx.bin)}; log level {ctx.log_level or 'default (info: one access line per request)'}, "
            "standard output and error appended to a file per instance")
    if ctx.baseline:
        same = ""
        if ctx.baseline.resolve() == ctx.bin.resolve():
            same = " — the same file: " + ("the gap is the cost of metrics" if ctx.metrics == "on" else "an A/A run, its gap is noise")
        add(f"- baseline binary: {describe_bin(ctx, ctx.baseline)}{same}")
    if ctx.metrics == "on":
        add("- metrics: on in the passthrough instance (passthrough GET and POST rows; Prometheus, /metrics to 127.0.0.1)"
            + (", off in the baseline" if ctx.baseline else ""))
    software = [f"{ctx.versions.get('nginx', 'nginx ?')} (worker_processes {ctx.nginx_workers})"]
    for name in ("haproxy", "caddy"):
        if name in ctx.versions:
            software.append(f"{ctx.versions[name]} ({ctx.peer_threads} threads)")
    software += ([ctx.versions.get("wrk", "?")] if ctx.needs_wrk else []) + [ctx.versions.get("openssl", "?")]
    add(f"- software: {', '.join(software)}")
    if ctx.needs_stack:
        pg = f"; PostgreSQL {ctx.versions['postgresql']} (scripts/postgres: fsync off, synchronous_commit off, log_statement none, pg_stat_statements)" if ctx.versions.get("postgresql") else ""
        add(f"- sealed parts: upstream django-oauth-toolkit {ctx.versions.get('dot', 'n/a')} behind sandbox/tokenproxy.py "
            f"(the token and capacity instances: its token endpoint directly){pg}")
    wrk_targets = [t for t in ctx.targets if t.kind == "wrk"]
    if wrk_targets or "direct" in ctx.names:
        add(f"- load: wrk -t{ctx.threads} -c{ctx.connections}, {ctx.duration} s per run; per target {ctx.rounds} round(s) interleaved "
            f"(the references, then the Gatehouse rows, each round), {ctx.warmup} s unrecorded warm-up per side first, {ctx.pause_s} s between runs; "
            "Benchmarks/check.lua checks the body of every 1,000th response; load generator on the same machine")
        add("")
        add(tables.main_table(ctx, [t for t in wrk_targets if not t.fronts]))
        bound = tables.bound_table(r)
        if bound:
            add(bound)
        peers_table = tables.peers_table(ctx, wrk_targets)
        if peers_table:
            add("### Gatehouse against each reference proxy")
            add("")
            add(peers_table)
        if "forward-auth" in ctx.names:
            add(tables.forward_auth_table(ctx))
    if "footprint" in ctx.names:
        add(f"Identity cache with 1,000,000 entries (goal ≤ 300 MiB): {r.footprint_text}")
        add("")
    if "storm" in ctx.names:
        add("### Refresh storm: two instances, one session, its upstream access token expired")
        add("")
        add(f"- {ctx.storm_workers * ctx.storm_per_worker} requests per storm: {ctx.storm_workers} threads × {ctx.storm_per_worker} "
            "`GET /api/data` (keep-alive, connected before a barrier), alternating between the two instances; `UPDATE sessions SET "
            "upstream_expires_at = 0` before each numbered storm, none before the control; 11 s between storms (the instances' 10 s session cache)")
        add("")
        if r.storm_files:
            table = subprocess.run([sys.executable, str(SEALED_PY), "storm-table", *map(str, r.storm_files)],
                                   capture_output=True, text=True).stdout.strip()
            add(table)
            add("")
            add(f"- stored session version after each storm: {' '.join(r.storm_versions) or 'n/a'} (+1 per numbered storm: one stored "
                "refresh each; unchanged by the control)")
        if r.storm_failed:
            add(f"- storm: FAILED ({r.storm_failed})")
        add("")
    if "token" in ctx.names:
        add(tables.token_table(ctx))
    if "capacity" in ctx.names:
        add(tables.capacity_table(ctx))
    if "failover" in ctx.names:
        add(failover.section(ctx))
    for name, text in r.profile.items():
        add(f"### Where the time goes: {name} ({r.profile_how.get(name, 'its last Gatehouse round, under perf')})")
        add("")
        add(text.strip())
        add("")
    if not ctx.nginx_only:
        add(goals_table(ctx.results))
    if r.wrk_shown:
        add("wrk commands (ports are picked per run; POST: check.lua sets the method, body and Content-Type):")
        add("")
        add("```")
        for key, cmd in r.wrk_shown.items():
            add(f"{key:<30} {cmd}")
        add("```")
    text = "\n".join(out).rstrip() + "\n"
    REPORT.write_text(text)
    print()
    print(text)
    say(f"written to {ctx.rel(REPORT)}; each run's wrk output and numbers in {ctx.rel(RUNS_DIR)}/, storms in storm-*.json")
