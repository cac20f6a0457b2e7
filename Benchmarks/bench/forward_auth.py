"""The forward-auth target: nginx auth_request (uncached and cached) and Caddy forward_auth in
front of the same backend, asking one Gatehouse instance's /forward-auth, next to nginx alone and
Gatehouse's own relay, in the same rounds. Each front's configuration is checked by its own tool,
Gatehouse's decision asked directly first, and each front checked before the load."""

import http.client
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from .paths import DATA
from .processes import check, free_ports, last_line, log_tail, say, wait_port, warn
from .targets import FRONT, PEER, TARGET
from . import gatehouse, references, rounds


def fronts_of(ctx, target):
    """The target's fronts, each with "" or why it is skipped (as the peers' rows are)."""
    out = []
    for name in target.fronts:
        f = FRONT[name]
        why = ""
        if f.peer == "nginx":
            if not ctx.nginx_auth_request:
                why = f"skipped: {ctx.nginx} was built without http_auth_request_module"
        elif f.peer not in ctx.peer_names:
            why = f"skipped: PEERS leaves {PEER[f.peer].label} out"
        elif f.peer not in ctx.peer_binary:
            why = "skipped: " + ctx.results.peer_notes.get(f.peer, f"{PEER[f.peer].label} is not installed")
        out.append((f, why))
    return out


def fa_cache_dir(ctx):
    """The cached front's proxy_cache folder: on tmpfs (/dev/shm) when there is one (it holds the
    token), else in the run's temp dir; removed at the end of the run."""
    if ctx.fa_cache is None:
        shm = Path("/dev/shm")
        if shm.is_dir() and os.access(shm, os.W_OK):
            ctx.fa_cache = Path(tempfile.mkdtemp(prefix="gatehouse-bench-fa-cache.", dir=shm))
        else:
            ctx.fa_cache = ctx.run_dir / "fa-cache"
            ctx.fa_cache.mkdir(exist_ok=True)
    return ctx.fa_cache


def front_env(ctx, peer):
    """The environment a front's process runs with (its peer's, e.g. Caddy's XDG folders)."""
    return dict(os.environ, **{k: v.format(dir=ctx.run_dir, threads=ctx.peer_threads) for k, v in PEER[peer].env})


def front_argv(ctx, peer, conf):
    """The command line of a front (nginx with the forward-auth configuration, or its peer's)."""
    if peer == "nginx":
        return [ctx.nginx, "-p", str(ctx.run_dir), "-c", str(conf), "-e", str(ctx.run_dir / "forward-auth-error.log"),
                "-g", "daemon off;"]
    return [a.format(binary=ctx.peer_binary[peer], conf=conf, dir=ctx.run_dir) for a in PEER[peer].command]


def front_validate(ctx, peer, conf):
    """"" when the front's own tool accepts its configuration (`nginx -t`, `caddy validate`), else why not."""
    if peer == "nginx":
        argv, tool = [ctx.nginx, "-t", "-q", "-p", str(ctx.run_dir), "-c", str(conf), "-e",
                      str(ctx.run_dir / "forward-auth-error.log")], "nginx -t"
    elif peer == "caddy":
        argv, tool = [ctx.peer_binary["caddy"], "validate", "--config", str(conf), "--adapter", "caddyfile"], "caddy validate"
    else:
        return ""
    r = subprocess.run(argv, capture_output=True, text=True, env=front_env(ctx, peer), cwd=ctx.run_dir)
    if r.returncode == 0:
        return ""
    lines = [l.strip() for l in (r.stdout + r.stderr).splitlines() if l.strip()]
    print(r.stdout + r.stderr, file=sys.stderr)
    return f"{tool} rejects {conf.name}: {lines[-1][:200] if lines else f'exit status {r.returncode}'}"


def render_fronts(ctx, fronts, gh_port, ports):
    """Each template of the fronts rendered once and checked by its tool: {template: (conf, problem)}."""
    confs = {}
    for f in fronts:
        if f.template in confs:
            continue
        conf = ctx.run_dir / f.template.removesuffix(".in")
        try:
            references.render_conf(ctx, f.template, conf, GATEHOUSE_PORT=gh_port, FA_CACHE_DIR=fa_cache_dir(ctx), **ports)
        except (RuntimeError, OSError) as error:
            confs[f.template] = (conf, f"cannot render {f.template}: {error}")
            continue
        confs[f.template] = (conf, front_validate(ctx, f.peer, conf))
    return confs


def start_front(ctx, front, conf, port):
    """Starts one front's process and waits for its port: (Popen, "") or (None, why not)."""
    argv = front_argv(ctx, front.peer, conf)
    log = ctx.run_dir / f"forward-auth-{front.peer}.log"
    with open(log, "wb") as out:
        p = ctx.children.spawn(argv, stdout=out, stderr=subprocess.STDOUT, env=front_env(ctx, front.peer), cwd=ctx.run_dir)
    if not wait_port(port, p, timeout=10):
        log_tail(log)
        if front.peer == "nginx":
            log_tail(ctx.run_dir / "forward-auth-error.log")
        ctx.children.stop(p)
        return None, f"did not start (`{' '.join(argv)}`; last line: {last_line(log)})"
    say(f"forward-auth front ({PEER[front.peer].label}) on 127.0.0.1:{port} (pid {p.pid}): {' '.join(argv)}")
    return p, ""


def ask(ctx, port, path, headers):
    """One GET to 127.0.0.1:port: (status, reason, [(header, value)], body), or None and the error."""
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        answer = (resp.status, resp.reason, resp.getheaders(), resp.read())
        conn.close()
        return answer, ""
    except (OSError, http.client.HTTPException) as error:
        return None, f"{type(error).__name__}: {error}"


def check_decision(ctx, port):
    """Asks Gatehouse's /forward-auth directly as the nginx front's subrequest does, for the token
    the load sends, then without a token: "" when it allows the first with X-BPId: 1000001 and
    does not allow the second; else exactly what it answered."""
    def shown(answer):
        status, reason, headers, body = answer
        text = f"{status} {reason}; " + "; ".join(f"{k}: {v}" for k, v in headers) + (f"; body {body[:300]!r}" if body else "; no body")
        return text.replace(ctx.token, "<token>")
    # Host: what the nginx front's subrequest names (its upstream); Gatehouse's public host is refused.
    asked = {"Host": "gatehouse_forward_auth", "X-Original-URI": "/api/data", "X-Original-Method": "GET", "X-Forwarded-Proto": "http",
             "X-Forwarded-Host": "127.0.0.1"}
    answer, error = ask(ctx, port, "/forward-auth", {"Authorization": f"Bearer {ctx.token}", **asked})
    if error:
        return f"GET /forward-auth (X-Original-URI /api/data, the load's token): {error}"
    ctx.results.fa_decision = shown(answer)
    say(f"GET /forward-auth with the load's token: {ctx.results.fa_decision}")
    if answer[0] != 200 or dict((k.lower(), v) for k, v in answer[2]).get("x-bpid") != "1000001":
        return f"Gatehouse's /forward-auth did not allow the load's token with X-BPId: 1000001; it answered {ctx.results.fa_decision}"
    refused, error = ask(ctx, port, "/forward-auth", asked)
    if error:
        return f"GET /forward-auth without a token: {error}"
    ctx.results.fa_refusal = shown(refused)
    if refused[0] == 200:
        return f"Gatehouse's /forward-auth allowed a request without a token: {ctx.results.fa_refusal}"
    return ""


def check_front(ctx, front, port):
    """The front relays the backend's body for the token, hands the backend Gatehouse's identity
    headers only (a client's own X-BPId / X-Subject replaced), and refuses a request without one."""
    bearer = f"Authorization: Bearer {ctx.token}"
    if not check(f"http://127.0.0.1:{port}/api/data", expect=DATA, headers=[bearer]):
        return "a GET /api/data with the token through it was not a 200 with the backend's body"
    expected = ctx.run_dir / "headers.expected"
    expected.write_text('{"x_bpid": "1000001", "x_subject": "bench"}')
    if not check(f"http://127.0.0.1:{port}/api/headers", expect=expected, headers=[bearer, "X-BPId: 666", "x-subject: mallory"]):
        return "the backend did not get X-BPId 1000001 / X-Subject bench from Gatehouse's answer (with a client's own sent)"
    answer, error = ask(ctx, port, "/api/data", {})
    if error:
        return f"a GET /api/data without a token: {error}"
    if answer[0] == 200:
        return "a GET /api/data without a token went through"
    return ""


def forward_auth_target(ctx):
    """The forward-auth target: its Gatehouse instance, the fronts, the checks, then the rounds."""
    t = TARGET["forward-auth"]
    r = ctx.results
    sides = references.reference_sides(ctx, t)
    fronts = fronts_of(ctx, t)
    gh_port, *front_ports = free_ports(1 + len(fronts))
    ports = {f.port: port for (f, _), port in zip(fronts, front_ports)}
    confs = render_fronts(ctx, [f for f, why in fronts if not why], gh_port, ports)
    if ctx.nginx_only:
        for f, why in fronts:
            problem = why or confs[f.template][1]
            tool = "nginx -t" if f.peer == "nginx" else f"{f.peer} validate"
            r.fa_notes.append(f"{f.label}: " + (problem or f"configuration accepted by {tool}; not run (nginx only)"))
        rounds.run_target(ctx, t, sides)
        return
    p, reason = gatehouse.start_relay(ctx, "forward-auth", gh_port, t.label, fragment="gatehouse-forward-auth.yaml.in")
    refused = reason or (check_decision(ctx, gh_port) if p else "not started")
    procs = {}
    for f, why in fronts:
        port = ports[f.port]
        why = why or refused or confs[f.template][1]
        if not why and f.template not in procs:
            procs[f.template] = start_front(ctx, f, confs[f.template][0], port)
        proc = None
        if not why:
            proc, why = procs[f.template]
        if not why:
            why = check_front(ctx, f, port)
        if why:
            warn(f"{f.label}: {why}")
            sides.append({"name": f.name, "failed": why})
            continue
        sides.append({"name": f.name, "url": f"http://127.0.0.1:{port}{t.path}", "cpu": [proc.pid, p.pid], "cpu_tree": True,
                      "cpu_parts": {"proxy": ([proc.pid], True), "gatehouse": ([p.pid], False)}, "rss": p.pid, "proc": p,
                      "instance": "forward-auth", "header": f"Authorization: Bearer {ctx.token}"})
    sides.append(gatehouse.gh_side(ctx, "gatehouse", p, reason, f"http://127.0.0.1:{gh_port}{t.path}", "forward-auth"))
    rounds.run_target(ctx, t, sides)
    for proc, _ in procs.values():
        ctx.children.stop(proc)
    ctx.children.stop(p)
