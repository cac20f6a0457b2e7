#!/usr/bin/env python3
"""Sealed-session helpers for Benchmarks/run.

    sealed.py sign-in GATEHOUSE_URL OUT
        Signs in as the tests do (sandbox/nativeapp.py: the app com.example.app, PKCE, the
        in-app browser filling in the upstream's login form as alice/wonderland-42), redeems the
        code and writes Gatehouse's access token (gha_…) to OUT. Needs `requests`: run it with
        the repo's venv (scripts/python-env).

    sealed.py sign-in GATEHOUSE_URL OUT --dpop-key KEY.pem
        The same with the tokens bound to a new ES256 key (RFC 9449), written to KEY.pem; when
        the token endpoint asks for its nonce (400 use_dpop_nonce), the code is redeemed again with
        a proof carrying it.

    sealed.py sign-in-many GATEHOUSE_URL OUT --count N [--client-id ID --redirect-uri URI] [--threads 4]
        N sign-ins the same way (one in-app browser per thread: alice logs in once per thread, the
        upstream's session cookie does the rest), for the token and capacity targets: refresh
        tokens are single-use, each load worker needs a chain of its own. Writes one JSON object
        per line, {"access_token", "refresh_token"}. With a passthrough client (e.g.
        com.example.bench) these are the upstream's own tokens. Needs `requests` (the venv).

    sealed.py nonce --key KEY.pem --token TOKEN --url URL
        Sends one `GET URL` with the DPoP-bound token and a proof without a nonce and prints the
        `DPoP-Nonce` of Gatehouse's 401 (use_dpop_nonce): the nonce `proofs --nonce` puts in
        every proof for an instance that requires its own nonces.

    sealed.py proofs --key KEY.pem --token TOKEN --url URL --count N [--first I] [--nonce NONCE] --out FILE
        N DPoP proofs for `GET URL`, one per line, each with its own jti (from I on): the DPoP
        targets' requests, each proof used once.

    sealed.py storm --url A --url B --token-file F --counts URL [--workers 250] [--per-worker 4]
                    [--path /api/data] [--expect-body FILE] [--identity-log FILE] --out OUT.json
        The refresh storm: WORKERS threads, each with one keep-alive connection to every
        instance opened beforehand, wait on one barrier, then send PER_WORKER requests each
        (`GET PATH`, `Authorization: Bearer <token>`), worker i's request r going to instance
        (i + r) mod 2. Each request's latency is measured from sending it to its last body
        byte. Writes a JSON summary (statuses, successes, p50/p99/max, refresh grants that
        reached the upstream according to the counting proxy's URL, identity-service calls
        counted from the backend's access log) and prints one line about it. Standard library.

    sealed.py storm-table OUT.json…
        The Markdown table of the storms.
"""

import argparse
import http.client
import json
import math
import os
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the sandbox package: the in-app sign-in, DPoP keys


def sign_in(args):
    from sandbox.nativeapp import App  # needs requests, from the venv

    app = App({"url": args.url.rstrip("/")})
    received = app.sign_in()
    if "code" not in received:
        print(f"sign-in: no code on the app's redirect: {sorted(received)}", file=sys.stderr)
        return 1
    headers = None
    if args.dpop_key:
        # A DPoP key (RFC 9449): the tokens are bound to it; the key is kept for `proofs`.
        from sandbox.dpop import Key
        from cryptography.hazmat.primitives import serialization
        key = Key("ES256")
        Path(args.dpop_key).write_bytes(key.private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                                  serialization.NoEncryption()))
        token_url = args.url.rstrip("/") + "/oauth/token"
        headers = {"DPoP": key.proof("POST", token_url)}
    answer = app.redeem(received["code"], headers=headers)
    if args.dpop_key and use_dpop_nonce(answer):
        # An instance that requires its nonce says which (RFC 9449 §8); the code is not spent by the refusal.
        headers = {"DPoP": key.proof("POST", token_url, nonce=answer.headers["DPoP-Nonce"])}
        answer = app.redeem(received["code"], headers=headers)
    if answer.status_code != 200:
        print(f"sign-in: the token endpoint answered {answer.status_code}: {answer.text[:300]}", file=sys.stderr)
        return 1
    access = answer.json().get("access_token", "")
    if not access.startswith("ghd_" if args.dpop_key else "gha_"):
        print(f"sign-in: the access token is not a sealed Gatehouse token (starts {access[:4]!r})", file=sys.stderr)
        return 1
    fd = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(access)
    print(f"sign-in: alice signed in through {args.url}; sealed access token ({len(access)} characters) "
          f"expires in {answer.json().get('expires_in')} s")
    return 0


def sign_in_many(args):
    from sandbox.nativeapp import App, InAppBrowser  # needs requests, from the venv

    lock = threading.Lock()
    pairs, failures = [], []

    def one_thread(share):
        browser = InAppBrowser()
        for _ in range(share):
            try:
                app = App({"url": args.url.rstrip("/")}, client_id=args.client_id, redirect_uri=args.redirect_uri)
                received = app.sign_in(browser)
                answer = app.redeem(received["code"])
                body = answer.json() if answer.status_code == 200 else {}
                if not body.get("refresh_token"):
                    raise RuntimeError(f"the token endpoint answered {answer.status_code}: {answer.text[:200]}")
                with lock:
                    pairs.append({"access_token": body["access_token"], "refresh_token": body["refresh_token"]})
            except Exception as error:  # noqa: BLE001 (reported below)
                with lock:
                    failures.append(f"{type(error).__name__}: {error}")

    started = time.monotonic()
    shares = [args.count // args.threads + (1 if i < args.count % args.threads else 0) for i in range(args.threads)]
    threads = [threading.Thread(target=one_thread, args=(share,)) for share in shares if share]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    fd = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        for pair in pairs:
            f.write(json.dumps(pair) + "\n")
    print(f"sign-in-many: {len(pairs)} of {args.count} sign-ins of {args.client_id} through {args.url} "
          f"in {time.monotonic() - started:.1f} s" + (f"; first failure: {failures[0]}" if failures else ""))
    return 0 if len(pairs) == args.count else 1


def use_dpop_nonce(answer):
    """Whether a token-endpoint answer (requests) asks for the server's nonce: 400 use_dpop_nonce with a DPoP-Nonce."""
    if answer.status_code != 400 or not answer.headers.get("DPoP-Nonce"):
        return False
    try:
        return answer.json().get("error") == "use_dpop_nonce"
    except ValueError:
        return False


def signed_in_key(path):
    """The key of `sign-in --dpop-key` as a sandbox.dpop.Key (its jwk and signing replaced by the file's)."""
    from sandbox.dpop import Key
    from cryptography.hazmat.primitives import serialization

    key = Key("ES256")
    key.private = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    numbers = key.private.public_key().public_numbers()
    key.jwk = {"kty": "EC", "crv": "P-256", "x": b64url(numbers.x.to_bytes(32, "big")), "y": b64url(numbers.y.to_bytes(32, "big"))}
    return key


def proofs(args):
    """One DPoP proof per line for `--url` (GET) and `--token` by the key of `sign-in --dpop-key`,
    each with its own jti (and, with --nonce, the instance's nonce): the DPoP targets' requests,
    each proof used once."""
    key = signed_in_key(args.key)
    started = time.monotonic()
    with open(args.out, "w") as f:
        for index in range(args.count):
            f.write(key.proof("GET", args.url, access_token=args.token, nonce=args.nonce or None,
                              jti=f"b{args.first + index:x}") + "\n")
    print(f"proofs: {args.count:,} DPoP proofs made in {time.monotonic() - started:.1f} s"
          + (" (with the instance's nonce)" if args.nonce else ""))
    return 0


def nonce(args):
    """The instance's DPoP nonce: one `GET --url` with the bound token and a proof without a nonce,
    whose 401 (use_dpop_nonce) carries it in DPoP-Nonce; printed on standard output."""
    key = signed_in_key(args.key)
    url = urlsplit(args.url)
    proof = key.proof("GET", args.url, access_token=args.token, jti=f"nonce-probe-{os.urandom(8).hex()}")
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    try:
        conn.request("GET", url.path, headers={"Authorization": f"DPoP {args.token}", "DPoP": proof})
        response = conn.getresponse()
        response.read()
    finally:
        conn.close()
    challenge = response.getheader("WWW-Authenticate") or ""
    value = response.getheader("DPoP-Nonce") or ""
    if response.status != 401 or 'error="use_dpop_nonce"' not in challenge or not value:
        print(f"nonce: expected a 401 with use_dpop_nonce and a DPoP-Nonce from GET {url.path}, got {response.status} "
              f"(WWW-Authenticate {challenge[:120]!r}, DPoP-Nonce {'present' if value else 'absent'})", file=sys.stderr)
        return 1
    print(value)
    return 0


def b64url(data):
    import base64
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def counts(url):
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def lines(path):
    if not path or not os.path.exists(path):
        return 0
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def percentile(sorted_values, fraction):
    """Nearest rank: the smallest value with at least `fraction` of the values at or below it."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(round(len(sorted_values) * fraction, 9)))
    return sorted_values[rank - 1]


def storm(args):
    token = Path(args.token_file).read_text().strip()
    expected = Path(args.expect_body).read_bytes() if args.expect_body else None
    targets = [urlsplit(u) for u in args.url]
    headers = {"Authorization": f"Bearer {token}", "Connection": "keep-alive"}
    barrier = threading.Barrier(args.workers)

    def worker(index):
        connections = [http.client.HTTPConnection(t.hostname, t.port, timeout=args.timeout) for t in targets]
        results = []
        try:
            for c in connections:
                c.connect()  # connect before the barrier: the storm measures requests, not handshakes
            barrier.wait(timeout=60)
            for r in range(args.per_worker):
                which = (index + r) % len(targets)
                conn = connections[which]
                start = time.perf_counter()
                try:
                    conn.request("GET", args.path, headers=headers)
                    response = conn.getresponse()
                    body = response.read()
                    elapsed = (time.perf_counter() - start) * 1000
                    ok = response.status == 200 and (expected is None or body == expected)
                    results.append((which, response.status, ok, elapsed, None))
                except (OSError, http.client.HTTPException) as error:
                    elapsed = (time.perf_counter() - start) * 1000
                    results.append((which, None, False, elapsed, type(error).__name__))
                    conn.close()
                    connections[which] = http.client.HTTPConnection(targets[which].hostname, targets[which].port,
                                                                    timeout=args.timeout)
        except threading.BrokenBarrierError:
            results.append((None, None, False, 0.0, "BrokenBarrierError"))
        finally:
            for c in connections:
                c.close()
        return results

    refresh_before = counts(args.counts)
    identity_before = lines(args.identity_log)
    wall_start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.workers) as pool:
        results = [item for batch in pool.map(worker, range(args.workers)) for item in batch]
    wall = (time.perf_counter() - wall_start) * 1000
    time.sleep(0.2)  # let the proxy's counter settle (a stray refresh after the last answer would show)
    refresh_after = counts(args.counts)
    identity_after = lines(args.identity_log)

    latencies = sorted(r[3] for r in results if r[0] is not None)
    statuses, errors = {}, {}
    for which, status, ok, _, error in results:
        if status is not None:
            statuses[str(status)] = statuses.get(str(status), 0) + 1
        if error:
            errors[error] = errors.get(error, 0) + 1
    per_instance = []
    for i in range(len(targets)):
        mine = sorted(r[3] for r in results if r[0] == i)
        per_instance.append({"requests": len(mine), "ok": sum(1 for r in results if r[0] == i and r[2]),
                             "p50_ms": percentile(mine, 0.50), "p99_ms": percentile(mine, 0.99),
                             "max_ms": mine[-1] if mine else None})
    summary = {
        "label": args.label,
        "expected_refresh_grants": args.expect_refresh_grants,
        "requests": args.workers * args.per_worker,
        "answered": sum(statuses.values()),
        "ok": sum(1 for r in results if r[2]),
        "statuses": statuses,
        "errors": errors,
        "per_instance": per_instance,
        "p50_ms": percentile(latencies, 0.50),
        "p99_ms": percentile(latencies, 0.99),
        "max_ms": latencies[-1] if latencies else None,
        "wall_ms": wall,
        "refresh_grants": refresh_after.get("refresh_token", 0) - refresh_before.get("refresh_token", 0),
        "token_requests": refresh_after.get("total", 0) - refresh_before.get("total", 0),
        "identity_calls": identity_after - identity_before,
        "workers": args.workers,
        "per_worker": args.per_worker,
    }
    with open(args.out, "w") as f:
        json.dump(summary, f, indent=1)
    print(f"storm: {summary['ok']}/{summary['requests']} succeeded ({statuses or 'no answers'}"
          f"{', errors ' + str(errors) if errors else ''}); refresh grants at the upstream: {summary['refresh_grants']}; "
          f"p50 {fmt(summary['p50_ms'])} ms, p99 {fmt(summary['p99_ms'])} ms, max {fmt(summary['max_ms'])} ms; "
          f"wall {fmt(wall)} ms")
    return 0


def fmt(value):
    if value is None:
        return "n/a"
    return f"{value:.2f}" if value < 100 else f"{value:.0f}"


def storm_table(args):
    out = ["| storm | refresh grants at the upstream | succeeded | p50 ms | p99 ms | max ms | wall ms | identity calls "
           "| p99 ms per instance (1 / 2) |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    notes = []
    for index, path in enumerate(args.files, 1):
        try:
            with open(path) as f:
                s = json.load(f)
        except (OSError, ValueError) as error:
            out.append(f"| {index} | failed | - | - | - | - | - | - | - |")
            notes.append(f"- storm {index}: no result ({error})")
            continue
        name = s.get("label") or str(index)
        expected = s.get("expected_refresh_grants", 1)
        flag = "" if s["refresh_grants"] == expected else f" (expected {expected})"
        ok = f"{s['ok']} / {s['requests']}" + ("" if s["ok"] == s["requests"] else " (NOT all)")
        split = " / ".join(fmt(p["p99_ms"]) for p in s["per_instance"])
        out.append(f"| {name} | {s['refresh_grants']}{flag} | {ok} | {fmt(s['p50_ms'])} | {fmt(s['p99_ms'])} "
                   f"| {fmt(s['max_ms'])} | {fmt(s['wall_ms'])} | {s['identity_calls']} | {split} |")
        if s["ok"] != s["requests"]:
            notes.append(f"- storm {name}: statuses {s['statuses']}, errors {s['errors'] or 'none'}")
        if s["token_requests"] != s["refresh_grants"]:
            notes.append(f"- storm {name}: {s['token_requests']} token-endpoint requests in all")
    if notes:
        out.append("")
        out.extend(notes)
    print("\n".join(out))
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("sign-in")
    p.add_argument("url")
    p.add_argument("out")
    p.add_argument("--dpop-key", help="bind the tokens to a new ES256 key, written (PEM) to this file")
    p.set_defaults(func=sign_in)

    p = sub.add_parser("sign-in-many")
    p.add_argument("url")
    p.add_argument("out")
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--client-id", default="com.example.app")
    p.add_argument("--redirect-uri", default="com.example.app:/oauth2redirect")
    p.add_argument("--threads", type=int, default=4)
    p.set_defaults(func=sign_in_many)

    p = sub.add_parser("proofs")
    p.add_argument("--key", required=True, help="the PEM key of sign-in --dpop-key")
    p.add_argument("--token", required=True)
    p.add_argument("--url", required=True)
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--first", type=int, default=0, help="the first proof's number (its jti): files of one key never overlap")
    p.add_argument("--nonce", default="", help="the instance's DPoP nonce (`nonce`), put in every proof")
    p.add_argument("--out", required=True)
    p.set_defaults(func=proofs)

    p = sub.add_parser("nonce")
    p.add_argument("--key", required=True, help="the PEM key of sign-in --dpop-key")
    p.add_argument("--token", required=True)
    p.add_argument("--url", required=True, help="a bound route's URL, e.g. http://127.0.0.1:PORT/api/data")
    p.set_defaults(func=nonce)

    p = sub.add_parser("storm")
    p.add_argument("--url", action="append", required=True, help="an instance's base URL (give two)")
    p.add_argument("--token-file", required=True)
    p.add_argument("--counts", required=True, help="the counting proxy's /_counts URL")
    p.add_argument("--workers", type=int, default=250)
    p.add_argument("--per-worker", type=int, default=4)
    p.add_argument("--path", default="/api/data")
    p.add_argument("--expect-body")
    p.add_argument("--identity-log")
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--out", required=True)
    p.add_argument("--label", default="", help="the row's name in storm-table (default: its number)")
    p.add_argument("--expect-refresh-grants", type=int, default=1)
    p.set_defaults(func=storm)

    p = sub.add_parser("storm-table")
    p.add_argument("files", nargs="+")
    p.set_defaults(func=storm_table)

    args = parser.parse_args()
    sys.exit(args.func(args) or 0)


if __name__ == "__main__":
    main()
