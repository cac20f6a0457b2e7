"""The relay targets (passthrough with its extra rows, post, tls: Gatehouse's own relay against the
references), nginx direct (the ceiling) and the identity cache's footprint."""

import re
import subprocess

from .paths import DATA
from .processes import check, free_ports, pause, say
from .targets import GH_ROW, TARGET
from . import gatehouse, references, rounds


def relay_targets(ctx):
    """The passthrough instance's targets (passthrough with its extra rows, post) and the https one (tls)."""
    pass_targets = [t for t in ctx.targets if t.instance == "passthrough"]
    main = extra = None
    if pass_targets and not ctx.nginx_only:
        main = gatehouse.start_relay(ctx, "passthrough", ctx.port_c, ", ".join(t.label for t in pass_targets))
    for t in pass_targets:
        sides = references.reference_sides(ctx, t)
        started = []
        for row_name in t.rows:
            row = GH_ROW[row_name]
            if ctx.nginx_only or (row.baseline and not ctx.baseline):
                continue
            port = free_ports(1)[0]
            p, reason = gatehouse.start_relay(ctx, row.name, port, f"{t.label} ({row.label})",
                                         binary=ctx.baseline if row.baseline else None, observability=row.observability)
            if p:
                started.append(p)
            sides.append(gatehouse.gh_side(ctx, row.name, p, reason, f"http://127.0.0.1:{port}{t.path}", row.name))
        if main:
            p, reason = main
            if not reason and p.poll() is not None:
                reason = "the passthrough instance is no longer running"
            if not reason and t.method == "POST" and not check(
                    f"http://127.0.0.1:{ctx.port_c}{t.path}", expect=t.expect, method="POST", data=t.body,
                    headers=[f"Authorization: Bearer {ctx.token}"]):
                reason = "the warm-up POST /api/post was not a 200 with the backend's answer"
            sides.append(gatehouse.gh_side(ctx, "gatehouse", p, reason, f"http://127.0.0.1:{ctx.port_c}{t.path}", "passthrough"))
        rounds.run_target(ctx, t, [s for s in sides if s])
        for p in started:
            ctx.children.stop(p)
    if main and main[0]:
        ctx.children.stop(main[0])
    if "tls" in ctx.names:
        t = TARGET["tls"]
        sides = references.reference_sides(ctx, t)
        if not ctx.nginx_only:
            route = (f"  - prefix: /tls\n    backend: https://127.0.0.1:{ctx.port_at}/api\n    backend_ca_file: {ctx.cert}\n"
                     "    methods: [GET]\n    upstream: bench\n    require:\n      attributes:\n        bpid_status: active\n"
                     "    identity_headers:\n      X-BPId: bpid\n      X-Subject: subject\n")
            p, reason = gatehouse.start_relay(ctx, "https", ctx.port_ct, t.label, routes=route)
            if p and not reason:
                reason = gatehouse.warm_up(ctx, "https", ctx.port_ct, "/tls", ctx.token)
                if reason:
                    ctx.children.stop(p)
            sides.append(gatehouse.gh_side(ctx, "gatehouse", p, reason, f"http://127.0.0.1:{ctx.port_ct}{t.path}", "https"))
            extra = p
        rounds.run_target(ctx, t, sides)
        if extra:
            ctx.children.stop(extra)


def direct(ctx):
    """nginx direct: wrk against the backend itself, one run (the ceiling)."""
    t = TARGET["direct"]
    rounds.measure(ctx, t, "nginx", 1, f"http://127.0.0.1:{ctx.port_a}/api/data", {"expect": DATA}, [ctx.backend.pid])
    pause(ctx.pause_s)


def footprint(ctx):
    """The identity cache's memory with 1,000,000 entries (`gatehouse bench-identity-cache`)."""
    r = ctx.results
    if ctx.binary_problem:
        r.footprint_text = f"skipped ({ctx.binary_problem})"
        return
    helptext = subprocess.run([str(ctx.bin), "--help"], capture_output=True, text=True)
    if "bench-identity-cache" not in helptext.stdout + helptext.stderr:
        r.footprint_text = "skipped (this gatehouse has no bench-identity-cache subcommand)"
        return
    say("gatehouse bench-identity-cache --entries 1000000")
    try:
        out = subprocess.run([str(ctx.bin), "bench-identity-cache", "--entries", "1000000"], capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        r.footprint_text = "failed (timed out after 600 s)"
        return
    text = (out.stdout + out.stderr).strip()
    if out.returncode:
        r.footprint_text = f"failed (exit {out.returncode}):\n\n```\n{text}\n```"
        return
    cache = re.search(r"cache: ([0-9.]+) MiB", text)
    after = re.search(r"after: ([0-9.]+) MiB", text)
    verdict = "no verdict (no 'cache: … MiB' in its output)"
    if cache:
        r.footprint_mib = float(cache.group(1))
        verdict = ("met" if r.footprint_mib <= 300 else "MISSED") + f": the cache {cache.group(1)} MiB" + \
            (f", the whole process {after.group(1)} MiB after filling it" if after else "")
    r.footprint_text = f"{verdict}\n\n```\n{text}\n```"
