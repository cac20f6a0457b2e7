"""What the run needs on the machine: wrk (for the load targets), nginx, openssl, the peers and the
packages the targets name (installed with scripts/system-packages PACKAGE… when missing and run as
root), their versions, and Gatehouse's release build (`swift build -c release`, unless --no-build)."""

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .paths import OUT_DIR, ROOT
from .processes import fail, log_tail, say, warn
from .targets import FRONT, PEER, PEERS


def which(candidates):
    """The first of `candidates` (a name on PATH or an absolute path) that is executable, or None."""
    for c in candidates:
        if c.startswith("/"):
            if os.access(c, os.X_OK):
                return c
        elif shutil.which(c):
            return shutil.which(c)
    return None


def install(packages):
    """The Debian packages installed when missing, by scripts/system-packages (the one list and the
    one installer of the repository: no service is started). False when it could not (not root, or
    apt-get failed); what it could not install, it says."""
    say(f"installing {' '.join(packages)} from Debian: scripts/system-packages {' '.join(packages)}")
    return subprocess.run([str(ROOT / "scripts/system-packages"), *packages], stdout=sys.stderr).returncode == 0


def tools(ctx):
    """The tools the selected targets need, installed when missing; their paths and versions."""
    wanted_peers = [PEER[p] for p in ctx.peer_names if p != "nginx"
                    and any(p in t.peers or p in (FRONT[f].peer for f in t.fronts) for t in ctx.targets if t.kind == "wrk")]
    missing = []
    if not which(PEER["nginx"].binaries):
        missing.append("nginx")
    ctx.needs_wrk = any(t.kind in ("wrk", "direct") for t in ctx.targets)
    needed_tools = (("wrk", "wrk"), ("openssl", "openssl")) if ctx.needs_wrk else (("openssl", "openssl"),)
    for tool, package in needed_tools:
        if not shutil.which(tool):
            missing.append(package)
    if ctx.profile and not shutil.which("perf"):
        missing.append("linux-perf")
    optional = [p.package for p in wanted_peers if not which(p.binaries)]
    if not ctx.profile and not shutil.which("perf") and any(t.profile_goals for t in ctx.targets):
        optional.append("linux-perf")  # a missed goal of such a target is profiled (without perf: a note)
    if ctx.needs_pg and not (shutil.which("psql") and list(Path("/usr/lib/postgresql").glob("*/bin/initdb"))):
        optional += ["postgresql", "postgresql-client"]
    named = sorted({p for t in ctx.targets for p in t.packages} - set(missing) - set(optional))
    if named:  # scripts/system-packages --check PACKAGE…: its own probes say which are missing
        check = subprocess.run([str(ROOT / "scripts/system-packages"), "--check", *named], capture_output=True, text=True)
        optional += [p for p in named if check.returncode and re.search(rf"missing: {re.escape(p)} ", check.stderr)]
    if missing or optional:
        if not install(missing + optional) and missing and os.geteuid() != 0:
            fail(f"run as root, or install them first: sudo apt-get install -y --no-install-recommends {' '.join(missing + optional)}", 1)
    ctx.nginx = which(PEER["nginx"].binaries)
    for tool, _ in needed_tools:
        if not shutil.which(tool):
            fail(f"no {tool} binary after installing", 1)
    if not ctx.nginx:
        fail("no nginx binary after installing", 1)
    build = subprocess.run([ctx.nginx, "-V"], capture_output=True, text=True).stderr
    for module in ("http_proxy_module", "http_upstream_keepalive_module"):
        if f"--without-{module}" in build:
            fail(f"{ctx.nginx} was built without {module}", 1)
    ctx.nginx_auth_request = "--with-http_auth_request_module" in build  # the forward-auth target's nginx fronts
    if "--with-http_ssl_module" not in build:
        fail(f"{ctx.nginx} was built without http_ssl_module (the https target needs it)", 1)
    ctx.peer_binary = {"nginx": ctx.nginx}
    for p in PEERS:
        if p.name == "nginx" or p.name not in ctx.peer_names:
            continue
        b = which(p.binaries)
        if b:
            ctx.peer_binary[p.name] = b
        else:
            ctx.results.peer_notes[p.name] = f"{p.label}: not installed (apt-get install {p.package}; needs root), its rows are skipped"
    for name, binary in ctx.peer_binary.items():
        out = subprocess.run([a.format(binary=binary) for a in PEER[name].version], capture_output=True, text=True)
        found = re.search(r"(\d+\.\d+[\w.+~-]*)", out.stdout + out.stderr)
        ctx.versions[name] = f"{PEER[name].label} {found.group(1) if found else '?'}"
    if shutil.which("wrk"):
        ctx.versions["wrk"] = (subprocess.run(["wrk", "-v"], capture_output=True, text=True).stdout.splitlines() or ["wrk ?"])[0].split(" Copyright")[0]
    ctx.versions["openssl"] = " ".join(subprocess.run(["openssl", "version"], capture_output=True, text=True).stdout.split()[:2])


def build(ctx):
    """Gatehouse's release build (unless --no-build); a failed build is noted, not fatal."""
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    if not ctx.needs_gatehouse:
        return
    if ctx.s.build:
        say("building Gatehouse in release: swift build -c release --product gatehouse")
        say("(the first release build takes about 9 minutes on 2 cores; later ones reuse .build)")
        started = time.monotonic()
        with open(OUT_DIR / "build.log", "w") as logf:
            p = subprocess.Popen(["swift", "build", "-c", "release", "--product", "gatehouse"], cwd=ROOT,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for line in p.stdout:
                logf.write(line)
                if re.search(r"error:|Linking gatehouse|Build complete|waiting until that process", line):
                    print(line.rstrip(), file=sys.stderr)
            rc = p.wait()
        if rc != 0:
            warn(f"the release build failed (exit {rc}); last 30 lines of {OUT_DIR / 'build.log'}:")
            log_tail(OUT_DIR / "build.log")
            ctx.binary_problem = "release build failed"
        else:
            say(f"built in {time.monotonic() - started:.0f} s")
    if not ctx.binary_problem and not os.access(ctx.bin, os.X_OK):
        ctx.binary_problem = f"no binary at {ctx.rel(ctx.bin)}"
        warn(ctx.binary_problem)
