"""Gatehouse instances: a relay configuration rendered from gatehouse.yaml.in (plus rows' and
fragments' additions), the binary's own verdict on it (`check-config`), `gatehouse serve` started
with its output in a log file and waited for until ready, the warm-up requests, and `gh_side`,
a Gatehouse row of a target."""

import subprocess
import time
from pathlib import Path

from .paths import BENCH_DIR, DATA
from .proc import vm_kib
from .processes import check, last_line, log_tail, render, say, warn
from .targets import FA_MAX_AGE
from . import references

from sandbox import gatehouse as gatehouse_process  # the repository root is on sys.path (Benchmarks/run)


def start_gatehouse(ctx, name, binary, config, port, targets, env=None):
    """Starts `BIN serve` (sandbox.gatehouse), its stdout and stderr written straight to a log file
    (as a deployment's log; nothing in this process reads them), and waits for the 'gatehouse is
    ready' line (or, above notice, the port). Returns (Popen, "") or (None, the failure)."""
    log = ctx.run_dir / f"gatehouse-{name}.log"
    ready_line = ctx.log_level in ("", "trace", "debug", "info", "notice")
    started = time.monotonic()
    g = gatehouse_process.start(ctx.run_dir, f"gatehouse-{name}", Path(config), env=env or ctx.gh_env, binary=binary, port=port,
                                log=log, log_level=ctx.log_level or None, follow=False, ready=None)
    ctx.children.adopt(g.process)
    ctx.contexts.callback(g.stop)  # at the end: closes its log file (the process is stopped by then)
    say(f"starting gatehouse '{name}' on 127.0.0.1:{port}: {' '.join(ctx.rel(a) for a in g.process.args)}")
    try:
        g.wait_ready("line" if ready_line else "port", ctx.ready_timeout)
        reason = ""
    except RuntimeError:
        if g.process.poll() is not None:
            reason = f"exited with status {g.process.returncode} before it was ready (configuration refused?)"
        else:
            reason = f"no 'gatehouse is ready' line within {ctx.ready_timeout} s" if ready_line else f"did not open port {port}"
    ready_ms = (time.monotonic() - started) * 1000
    if reason:
        warn(f"gatehouse '{name}': {reason}; last 30 lines of its log:")
        log_tail(log)
        ctx.children.stop(g.process)
        line = last_line(log)
        return None, reason + (f": {line}" if line else "")
    p = g.process
    how = "to the 'gatehouse is ready' log line" if ready_line else "to the port accepting (polled every 5 ms)"
    rss, _ = vm_kib(p.pid)
    say(f"gatehouse '{name}' ready in {ready_ms:.1f} ms (pid {p.pid}; VmRSS {rss} KiB)")
    ctx.results.instances.append({"name": name, "targets": targets, "ready_ms": f"{ready_ms:.1f}", "ready_how": how,
                                  "rss_ready_kib": rss, "pid": p.pid})
    return p, ""


def warm_up(ctx, name, port, prefix, bearer):
    """The first requests through an instance (opens the identity cache's entry): "" or why it failed;
    a note when the identity headers did not reach the backend."""
    if not check(f"http://127.0.0.1:{port}{prefix}/data", expect=DATA, headers=[f"Authorization: Bearer {bearer}"]):
        reason = f"the warm-up GET {prefix}/data was not a 200 with the backend's body"
        warn(f"gatehouse '{name}': {reason}; last 30 lines of its log:")
        log_tail(ctx.run_dir / f"gatehouse-{name}.log")
        return reason
    expected = ctx.run_dir / "headers.expected"
    expected.write_text('{"x_bpid": "1000001", "x_subject": "bench"}')
    if not check(f"http://127.0.0.1:{port}{prefix}/headers", expect=expected, headers=[f"Authorization: Bearer {bearer}"]):
        ctx.results.notes.append(f"gatehouse '{name}': the identity headers X-BPId / X-Subject did NOT reach the backend as configured")
    return ""


def relay_config(ctx, name, port, routes="", observability=(), fragment=None):
    """gatehouse.yaml.in rendered for one instance; fragment: a template of top-level sections
    appended to it (gatehouse-forward-auth.yaml.in)."""
    d = ctx.run_dir / f"gatehouse-{name}"
    d.mkdir(parents=True, exist_ok=True)
    conf = d / "gatehouse.yaml"
    render(BENCH_DIR / "gatehouse.yaml.in", conf, references.values(ctx, GATEHOUSE_PORT=port, STATE_DIR=d, EXTRA_ROUTES=routes))
    if fragment:
        render(BENCH_DIR / fragment, d / fragment.removesuffix(".in"), references.values(ctx, FA_MAX_AGE=FA_MAX_AGE))
        with open(conf, "a") as f:
            f.write((d / fragment.removesuffix(".in")).read_text())
    lines = list(observability)
    if ctx.metrics == "on" and name in ("passthrough", "access-log-off"):  # the access-log row differs by its log only
        lines = ["metrics:", "  allow: [127.0.0.1]"] + lines
    if lines:
        with open(conf, "a") as f:
            f.write("observability:\n" + "".join(f"  {line}\n" for line in lines))
    return conf


def config_refused(ctx, binary, conf, keys=("observability", "access_log")):
    """The binary's verdict on a configuration (`check-config`): "" when it accepts it."""
    r = subprocess.run([str(binary), "check-config", str(conf)], capture_output=True, text=True, env=ctx.gh_env)
    if r.returncode == 0:
        return ""
    lines = [l.strip() for l in (r.stdout + r.stderr).splitlines() if l.strip()]
    interesting = [l for l in lines if any(k in l for k in keys)] or lines
    return interesting[0][:200] if interesting else f"check-config exited with {r.returncode}"


def start_relay(ctx, name, port, targets, routes="", binary=None, observability=(), fragment=None):
    """A passthrough relay instance, configured, started and warmed up: (Popen, "") or (None, why not)."""
    if ctx.binary_problem:
        return None, ctx.binary_problem
    conf = relay_config(ctx, name, port, routes, observability, fragment)
    if observability or fragment:
        refused = config_refused(ctx, binary or ctx.bin, conf, ("forward_auth",) if fragment else ("observability", "access_log"))
        if refused:
            return None, f"skipped: this binary refuses the configuration ({refused})"
    p, reason = start_gatehouse(ctx, name, binary or ctx.bin, conf, port, targets)
    if p and not reason:
        reason = warm_up(ctx, name, port, "/api", ctx.token)
        if reason:
            ctx.children.stop(p)
            p = None
    return p, reason


def gh_side(ctx, name, proc, reason, url, instance, header=None, proofs=None, counts=None):
    """A Gatehouse row of a target for run_target (None with --only nginx; a failed row with the reason)."""
    if ctx.nginx_only:
        return None
    if reason or proc is None:
        return {"name": name, "failed": reason or "not started"}
    return {"name": name, "url": url, "cpu": [proc.pid], "rss": proc.pid, "proc": proc, "instance": instance,
            "header": header or f"Authorization: Bearer {ctx.token}", "proofs": proofs, "counts": counts}
