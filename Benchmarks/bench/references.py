"""The nginx backend (with the identity-service double and the https port) and the reference
proxies in front of it (nginx proxy_pass, HAProxy, Caddy: PEERS), each checked on every path a
target asks of it; `reference_sides` are the rows a target measures them in."""

import os
import pwd
import shutil
import subprocess
import sys
from pathlib import Path

from .paths import BENCH_DIR, DATA, IDENTITY, POST_ANSWER, POST_BODY
from .processes import check, fail, last_line, log_tail, render, say, wait_port, warn
from .targets import PEER


def values(ctx, **extra):
    """The placeholders every template may use (ports, the run's folder, the worker counts), plus `extra`."""
    v = {"RUN_DIR": ctx.run_dir, "BACKEND_PORT": ctx.port_a, "BACKEND_TLS_PORT": ctx.port_at,
         "NGINX_WORKERS": ctx.nginx_workers, "PEER_THREADS": ctx.peer_threads,
         "POST_ANSWER": POST_ANSWER.read_text()}
    v.update(extra)
    return v


def render_conf(ctx, template, out, **extra):
    """A template of Benchmarks/ rendered to `out`; an nginx configuration gets its `user` line first."""
    render(BENCH_DIR / template, out, values(ctx, **extra))
    if str(out).endswith(".conf"):  # nginx: the user directive goes first
        user = ("user root root;  # workers as root so they can read the temp dir; loopback only"
                if os.geteuid() == 0 else f"# not root: workers run as {pwd.getpwuid(os.geteuid()).pw_name}")
        Path(out).write_text(user + "\n" + Path(out).read_text())


def start_backend(ctx):
    """The nginx backend (http and https, the identity double), checked on every path it serves."""
    rd = ctx.run_dir
    for d in ("www/api", "backend-tmp", "proxy-tmp", "tls", "caddy-data", "caddy-config"):
        (rd / d).mkdir(parents=True, exist_ok=True)
    shutil.copy(DATA, rd / "www/api/data")
    shutil.copy(IDENTITY, rd / "www/identity")
    ctx.cert = rd / "tls/cert.pem"
    r = subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                        "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                        "-keyout", str(rd / "tls/key.pem"), "-out", str(ctx.cert)], capture_output=True, text=True)
    if r.returncode:
        print(r.stdout + r.stderr, file=sys.stderr)
        fail("openssl could not make the https backend's certificate", 1)
    render_conf(ctx, "nginx-backend.conf.in", rd / "backend.conf")
    ctx.backend = start_nginx(ctx, "backend", rd / "backend.conf", ctx.port_a)
    if not wait_port(ctx.port_at, timeout=5):
        fail("the nginx backend does not listen on its https port", 1)
    for url, kw in ((f"http://127.0.0.1:{ctx.port_a}/api/data", {"expect": DATA}),
                    (f"http://127.0.0.1:{ctx.port_a}/identity", {"expect": IDENTITY}),
                    (f"http://127.0.0.1:{ctx.port_a}/api/post", {"expect": POST_ANSWER, "method": "POST", "data": POST_BODY}),
                    (f"https://127.0.0.1:{ctx.port_at}/api/data", {"expect": DATA, "cacert": ctx.cert})):
        if not check(url, **kw):
            fail(f"the nginx backend does not serve {url} as expected", 1)


def start_nginx(ctx, name, conf, port):
    """An nginx from a configuration checked by `nginx -t` first; stops the run when it does not start."""
    t = subprocess.run([ctx.nginx, "-t", "-q", "-p", str(ctx.run_dir), "-c", str(conf), "-e", str(ctx.run_dir / f"{name}-error.log")],
                       capture_output=True, text=True)
    if t.returncode:
        print(t.stdout + t.stderr, file=sys.stderr)
        fail(f"nginx rejects {conf} (KEEP_TMP=1 keeps it)", 1)
    with open(ctx.run_dir / f"{name}.out", "wb") as out:
        p = ctx.children.spawn([ctx.nginx, "-p", str(ctx.run_dir), "-c", str(conf), "-e", str(ctx.run_dir / f"{name}-error.log"),
                                 "-g", "daemon off;"], stdout=out, stderr=subprocess.STDOUT)
    if not wait_port(port, p, timeout=5):
        log_tail(ctx.run_dir / f"{name}.out")
        log_tail(ctx.run_dir / f"{name}-error.log")
        fail(f"nginx {name} did not start", 1)
    say(f"nginx {name} on 127.0.0.1:{port} (pid {p.pid})")
    return p


def start_peers(ctx):
    """Every reference proxy some selected wrk target uses; each checked on every path it serves."""
    wanted = [p for p in ctx.peer_names if p in ctx.peer_binary
              and any(p in t.peers for t in ctx.targets if t.kind == "wrk")]
    if "nginx" not in wanted:
        wanted.insert(0, "nginx")
    for name in wanted:
        peer = PEER[name]
        port, tls_port = ctx.peer_ports[name]
        conf = ctx.run_dir / ("proxy.conf" if name == "nginx" else Path(peer.template).name.removesuffix(".in"))
        try:
            render_conf(ctx, peer.template, conf, PEER_PORT=port, PEER_TLS_PORT=tls_port, PROXY_PORT=port, PROXY_TLS_PORT=tls_port)
        except (RuntimeError, OSError) as error:
            peer_failed(ctx, peer, f"cannot render {peer.template}: {error}")
            continue
        if name == "nginx":
            ctx.peer_procs[name] = start_nginx(ctx, "proxy", conf, port)
        else:
            argv = [a.format(binary=ctx.peer_binary[name], conf=conf, dir=ctx.run_dir) for a in peer.command]
            env = dict(os.environ, **{k: v.format(dir=ctx.run_dir, threads=ctx.peer_threads) for k, v in peer.env})
            log = ctx.run_dir / f"{name}.log"
            with open(log, "wb") as out:
                p = ctx.children.spawn(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ctx.run_dir)
            if not wait_port(port, p, timeout=10):
                log_tail(log)
                ctx.children.stop(p)
                peer_failed(ctx, peer, f"did not start (`{' '.join(argv)}`; last line: {last_line(log)})")
                continue
            say(f"{peer.label} on 127.0.0.1:{port} (pid {p.pid}): {' '.join(argv)}")
            ctx.peer_procs[name] = p
        # It must actually proxy: each path a target of it asks for, with the right body.
        paths = {(t.ref_path, t.method, t.tls) for t in ctx.targets if t.kind == "wrk" and name in t.peers}
        for path, method, tls in sorted(paths, key=str):
            use_port = tls_port if tls else port
            t = next(t for t in ctx.targets if t.kind == "wrk" and t.ref_path == path and t.method == method and t.tls == tls)
            if not check(f"http://127.0.0.1:{use_port}{path}", expect=t.expect, method=method or "GET", data=t.body):
                if not peer.optional:
                    fail(f"the {peer.label} proxy does not relay {method or 'GET'} {path}{' to the https backend' if tls else ''}", 1)
                ctx.children.stop(ctx.peer_procs.pop(name))
                peer_failed(ctx, peer, f"does not relay {method or 'GET'} {path} with the backend's body")
                break


def peer_failed(ctx, peer, reason):
    """A peer that cannot run: its rows are skipped with a note (nginx, not optional, stops the run)."""
    if not peer.optional:
        fail(f"{peer.label}: {reason}", 1)
    warn(f"{peer.label}: {reason}; its rows are skipped")
    ctx.results.peer_notes[peer.name] = f"{peer.label}: FAILED ({reason})"


def reference_sides(ctx, target):
    """The reference rows (nginx and the peers) a target is measured against, as run_target takes them."""
    sides = []
    for name in target.peers:
        if name not in ctx.peer_names:
            continue
        if name not in ctx.peer_procs:
            if name in ctx.results.peer_notes:
                ctx.results.failed[(target.name, name)] = ctx.results.peer_notes[name]
            continue
        port, tls_port = ctx.peer_ports[name]
        sides.append({"name": name, "url": f"http://127.0.0.1:{tls_port if target.tls else port}{target.ref_path}",
                      "cpu": [ctx.peer_procs[name].pid], "cpu_tree": PEER[name].cpu == "tree"})
    return sides
