"""Refresh load through /oauth/token: `refresh_load` (worker threads, each with its own refresh
chain), the token target (Gatehouse's overhead over a direct refresh; with BASELINE_BIN, the
baseline binary's sequential passthrough refresh on SQLite too) and the capacity target
(sealed refreshes/s of two instances on one PostgreSQL, statements and CPU per refresh, where it
saturates, with pg_stat_activity sampled by WaitSampler)."""

import base64
import http.client
import json
import os
import subprocess
import sys
import threading
import time
import urllib.parse

from .goals import token_overhead
from .proc import CLK_TCK, cpu_delta, cpu_snapshot
from .processes import free_ports, pause, say
from .stats import fmt_ms, percentile, median_or_none
from . import stack


def refresh_load(urls, headers, client_id, chains, concurrency, count=None, seconds=None):
    """`concurrency` workers, each with a keep-alive connection and a refresh chain of its own
    (refresh tokens are single-use: each answer's refresh_token is the worker's next). count:
    refreshes in all (sequential: one worker); seconds: how long. The chains are updated in place."""
    if isinstance(urls, str):
        urls = [urls]
    latencies, errors, first_error = [], [0], [None]
    lock = threading.Lock()
    deadline = time.monotonic() + seconds if seconds else None
    remaining = [count] if count else None
    barrier = threading.Barrier(concurrency)

    def worker(i):
        url = urllib.parse.urlsplit(urls[i % len(urls)])
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
        chain = chains[i]
        mine = []
        try:
            conn.connect()
        except OSError:
            pass
        try:
            barrier.wait(timeout=60)
        except threading.BrokenBarrierError:
            return
        while True:
            if deadline and time.monotonic() >= deadline:
                break
            if remaining is not None:
                with lock:
                    if remaining[0] <= 0:
                        break
                    remaining[0] -= 1
            form = {"grant_type": "refresh_token", "refresh_token": chain["refresh_token"]}
            if client_id:
                form["client_id"] = client_id
            body = urllib.parse.urlencode(form)
            h = {"Content-Type": "application/x-www-form-urlencoded", "Accept": "application/json", **headers}
            start = time.perf_counter()
            try:
                conn.request("POST", url.path, body=body, headers=h)
                resp = conn.getresponse()
                data = resp.read()
                elapsed = (time.perf_counter() - start) * 1000
                answer = json.loads(data) if resp.status == 200 else None
                if not answer or not answer.get("refresh_token"):
                    raise RuntimeError(f"status {resp.status}: {data[:160]!r}")
                chain["refresh_token"] = answer["refresh_token"]
                mine.append(elapsed)
            except (OSError, http.client.HTTPException, RuntimeError, ValueError) as error:
                with lock:
                    errors[0] += 1
                    first_error[0] = first_error[0] or f"{type(error).__name__}: {error}"
                conn.close()
                conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
                break  # the chain may be spent: this worker stops
        conn.close()
        with lock:
            latencies.extend(mine)

    started = time.monotonic()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - started
    latencies.sort()
    return {"ok": len(latencies), "errors": errors[0], "first_error": first_error[0], "wall": wall,
            "rate": len(latencies) / wall if wall else 0.0,
            "p50": median_or_none(latencies), "p99": percentile(latencies, 99), "samples": latencies}


TOKEN_SLICES = 4   # the sequential rows of a store run in this many slices each, in turn (interleaved)


def slices(count, parts=TOKEN_SLICES):
    """`count` refreshes cut into at most `parts` slices, as even as can be (the first ones larger)."""
    parts = max(1, min(parts, count))
    return [count // parts + (1 if i < count % parts else 0) for i in range(parts)]


def merge_loads(parts):
    """One refresh_load result of a row from its slices: the refreshes, errors and wall time added
    up, the rate and the percentiles over every latency."""
    latencies = sorted(x for part in parts for x in part["samples"])
    wall = sum(part["wall"] for part in parts)
    return {"ok": len(latencies), "errors": sum(part["errors"] for part in parts),
            "first_error": next((part["first_error"] for part in parts if part["first_error"]), None), "wall": wall,
            "rate": len(latencies) / wall if wall else 0.0,
            "p50": median_or_none(latencies), "p99": percentile(latencies, 99), "samples": latencies}


class WaitSampler:
    """Samples pg_stat_activity (the gatehouse database's other backends) every 100 ms through one
    psql session: the share of samples in which a backend was on CPU (active, no wait event),
    waiting on a lock, on IO, idle in a transaction, or idle (waiting for its client: Gatehouse)."""

    QUERY = ("SELECT state, coalesce(wait_event_type, '') FROM pg_stat_activity WHERE datname = 'gatehouse' "
             "AND pid <> pg_backend_pid() AND backend_type = 'client backend';")

    def __init__(self, run):
        self.run = run
        self.counts = {}
        self.total = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def start(self):
        self.proc = subprocess.Popen(["psql", "-h", self.run.pg_host, "-p", str(self.run.pg_port), "-U", "gatehouse", "-d", "gatehouse",
                                      "-tA", "-q"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
        self.thread.start()

    def loop(self):
        while not self.stopping.is_set():
            try:
                self.proc.stdin.write(self.QUERY + "\n\\echo @@END\n")
                self.proc.stdin.flush()
                while True:
                    line = self.proc.stdout.readline()
                    if not line or line.strip() == "@@END":
                        break
                    if "|" not in line:
                        continue
                    state, wait = line.rstrip("\n").split("|", 1)
                    if state == "active":
                        kind = "CPU" if not wait else ("Lock" if wait in ("Lock", "LWLock") else "IO" if wait == "IO" else wait)
                    elif state == "idle in transaction":
                        kind = "idle in transaction"
                    else:
                        kind = "idle"
                    self.counts[kind] = self.counts.get(kind, 0) + 1
                    self.total += 1
            except (OSError, ValueError):
                return
            self.stopping.wait(0.1)

    def stop(self):
        self.stopping.set()
        self.thread.join(timeout=5)
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    def shares(self):
        return {k: v * 100 / self.total for k, v in self.counts.items()} if self.total else {}


def saturation(row):
    """Where one capacity level saturates, from the backends' states and the CPU split."""
    w = row["waits"]
    cores = os.cpu_count() or 1
    busy = row["cpu_pg_cores"] + row["cpu_gh_cores"] + row["cpu_up_cores"] + row.get("cpu_client_cores", 0)
    if w.get("Lock", 0) >= 20:
        return "PostgreSQL locks"
    if w.get("CPU", 0) + w.get("IO", 0) >= 50:
        return "PostgreSQL CPU" if row["cpu_pg_cores"] > row["cpu_gh_cores"] else "PostgreSQL (active backends)"
    if w.get("idle", 0) + w.get("idle in transaction", 0) >= 50:
        where = "Gatehouse (PostgreSQL backends mostly idle, waiting for it)"
        if busy >= 0.8 * cores:
            where += f"; the machine's CPU ({busy:.1f} of {cores} cores busy, the load client included)"
        return where
    return "mixed"


BASELINE_ROW = "passthrough app, baseline binary"


def token_target(ctx):
    """The token target: refreshes through Gatehouse (passthrough and sealed app) against the same
    refresh sent directly to the upstream, sequential and concurrent, on SQLite and PostgreSQL.
    Sequential: the rows in turn, TOKEN_SLICES slices each; with BASELINE_BIN, on SQLite, the
    baseline binary's passthrough row among them (its own instance, same configuration)."""
    r = ctx.results
    if ctx.stack_failed:
        r.token_notes.append(f"- not run: sealed set-up: {ctx.stack_failed}")
        return
    secret = ctx.gh_env["BENCH_SEALED_SECRET"]
    basic = "Basic " + base64.b64encode(f"{urllib.parse.quote('gatehouse-bench', safe='')}:{urllib.parse.quote(secret, safe='')}".encode()).decode()
    direct_url = f"{ctx.upstream_url}/o/token/"
    n = ctx.token_concurrency + 1
    stores = [("SQLite", "token-sqlite", ctx.port_s3, None), ("PostgreSQL", "token-pg", ctx.port_s1, "pg")]
    direct_chains = None
    for store_label, name, port, kind in stores:
        if kind == "pg" and not ctx.pg_host:
            continue
        d = ctx.run_dir / name
        d.mkdir(exist_ok=True)
        store = stack.pg_store(ctx) if kind == "pg" else f"sqlite_path: {d}/gatehouse.sqlite"
        p, reason = stack.start_sealed(ctx, name, port, store, "token endpoint", direct_token_endpoint=True)
        if reason:
            r.token_notes.append(f"- {store_label}: Gatehouse FAILED ({reason})")
            continue
        say(f"token, {store_label}: {n} passthrough and {n} sealed sign-ins (refresh tokens are single-use: a chain per worker)")
        if direct_chains is None:
            direct_chains = stack.sign_in_many(ctx, port, n, "com.example.bench", "com.example.bench:/cb", ctx.run_dir / "direct-chains")
        pass_chains = stack.sign_in_many(ctx, port, n, "com.example.bench", "com.example.bench:/cb", ctx.run_dir / f"{name}-pass-chains")
        sealed_chains = stack.sign_in_many(ctx, port, n, "com.example.app", "com.example.app:/oauth2redirect", ctx.run_dir / f"{name}-sealed-chains")
        if not (direct_chains and pass_chains and sealed_chains):
            r.token_notes.append(f"- {store_label}: the sign-ins failed (see the log above)")
            ctx.children.stop(p)
            continue
        gh_url = f"http://127.0.0.1:{port}/oauth/token"
        rows = [("direct (upstream)", direct_url, {"Authorization": basic}, None, direct_chains),
                ("passthrough app", gh_url, {}, "com.example.bench", pass_chains),
                ("sealed app", gh_url, {}, "com.example.app", sealed_chains)]
        baseline = start_token_baseline(ctx, store_label, name, port) if ctx.baseline and kind is None else None
        for mode in ("sequential", "concurrent"):
            mode_rows = list(rows)
            if baseline and mode == "sequential":
                mode_rows.insert(2, (BASELINE_ROW, baseline[1], {}, "com.example.bench", baseline[2]))
            results = {}
            if mode == "sequential":
                say(f"token, {store_label}: {ctx.token_sequential} refreshes one after the other per row, the rows in turn "
                    f"({len(slices(ctx.token_sequential))} slices each): {', '.join(row[0] for row in mode_rows)}")
                parts = {row[0]: [] for row in mode_rows}
                for count in slices(ctx.token_sequential):
                    for label, url, headers, client_id, chains in mode_rows:
                        parts[label].append(refresh_load(url, headers, client_id, chains[:1], 1, count=count))
                for label, *_ in mode_rows:
                    results[label] = merge_loads(parts[label])
                    show_load(f"{label}, sequential", results[label])
                pause(ctx.pause_s)
            else:
                for label, url, headers, client_id, chains in mode_rows:
                    say(f"token, {store_label}, {label}: {ctx.token_concurrency} concurrent refresh chains for {ctx.duration} s")
                    results[label] = refresh_load(url, headers, client_id, chains[1:], ctx.token_concurrency, seconds=ctx.duration)
                    show_load(label, results[label])
                    pause(ctx.pause_s)
            base = results["direct (upstream)"]
            for label, *_ in mode_rows:
                res = dict(results[label])
                res.pop("samples", None)
                row = {"row": f"{store_label}, {mode}, {label}", "store": store_label, "mode": mode, "side": label, **res}
                if label != "direct (upstream)":
                    row.update(token_overhead(res, base, concurrent=mode == "concurrent"))
                if label == BASELINE_ROW:
                    row["met"] = None  # the baseline binary is compared, not judged
                    row["baseline"] = True
                r.token_rows.append(row)
        if baseline:
            ctx.children.stop(baseline[0])
        ctx.children.stop(p)


def start_token_baseline(ctx, store_label, name, port):
    """The baseline binary's instance for the token target (same configuration, its own port and
    SQLite file) and a passthrough refresh chain for it, signed in through the current instance
    (`port`; the upstream's own tokens, good at either): (Popen, its /oauth/token URL, chains), or
    None with a note."""
    r = ctx.results
    bport = free_ports(1)[0]
    d = ctx.run_dir / f"{name}-baseline"
    d.mkdir(exist_ok=True)
    p, reason = stack.start_sealed(ctx, f"{name}-baseline", bport, f"sqlite_path: {d}/gatehouse.sqlite",
                                   "token endpoint (baseline binary)", direct_token_endpoint=True, binary=ctx.baseline)
    if reason:
        r.token_notes.append(f"- {store_label}: the baseline binary FAILED ({reason})")
        return None
    chains = stack.sign_in_many(ctx, port, 1, "com.example.bench", "com.example.bench:/cb", ctx.run_dir / f"{name}-baseline-chains")
    if not chains:
        r.token_notes.append(f"- {store_label}: the baseline row's sign-in failed (see the log above)")
        ctx.children.stop(p)
        return None
    return p, f"http://127.0.0.1:{bport}/oauth/token", chains


def show_load(label, res):
    """One refresh load's line on standard error."""
    print(f"    -> {label}: {res['ok']} refreshes ({res['errors']} errors{': ' + res['first_error'] if res['first_error'] else ''}), "
          f"{res['rate']:,.0f}/s, median {fmt_ms(res['p50'] or 0)} ms, p99 {fmt_ms(res['p99'] or 0)} ms", file=sys.stderr)


def capacity_target(ctx):
    """The capacity target: two sealed instances on one PostgreSQL, the concurrency raised level by
    level until the refresh rate stops rising; statements, transactions and CPU per refresh."""
    r = ctx.results
    if ctx.stack_failed or not ctx.pg_host:
        r.capacity_notes.append(f"- not run: {ctx.stack_failed or 'no PostgreSQL'}")
        return
    procs = []
    for name, port in (("capacity-1", ctx.port_s1), ("capacity-2", ctx.port_s2)):
        p, reason = stack.start_sealed(ctx, name, port, stack.pg_store(ctx), "sealed refresh capacity", direct_token_endpoint=True)
        if reason:
            r.capacity_notes.append(f"- {name}: FAILED ({reason})")
            for q in procs:
                ctx.children.stop(q)
            return
        procs.append(p)
    top = max(ctx.capacity_levels)
    say(f"capacity: {top} sealed sign-ins (a chain per worker), half through each instance")
    chains = []
    for i, port in enumerate((ctx.port_s1, ctx.port_s2)):
        got = stack.sign_in_many(ctx, port, top // 2 + (top % 2 if i == 0 else 0), "com.example.app", "com.example.app:/oauth2redirect",
                                ctx.run_dir / f"capacity-chains-{i}")
        if not got:
            r.capacity_notes.append("- the sign-ins failed (see the log above)")
            for q in procs:
                ctx.children.stop(q)
            return
        chains += got
    urls = [f"http://127.0.0.1:{ctx.port_s1}/oauth/token", f"http://127.0.0.1:{ctx.port_s2}/oauth/token"]
    postmaster = int((ctx.pg_dir / "data/postmaster.pid").read_text().split()[0])
    best = 0.0
    for level in ctx.capacity_levels:
        say(f"capacity: {level} concurrent sealed refresh chains across both instances for {ctx.duration} s")
        if ctx.pg_statements:
            stack.psql(ctx, "SELECT pg_stat_statements_reset()")
        db_before = pg_db_stats(ctx)
        cpu_before = {k: cpu_snapshot(v) for k, v in (("pg", [postmaster]), ("gh", [q.pid for q in procs]), ("up", [ctx.upstream.pid]))}
        sampler = WaitSampler(ctx)
        sampler.start()
        client_before = time.process_time()
        res = refresh_load(urls, {}, "com.example.app", chains[:level], level, seconds=ctx.duration)
        res.pop("samples")
        client_s = time.process_time() - client_before
        sampler.stop()
        cpu_after = {k: cpu_snapshot(v) for k, v in (("pg", [postmaster]), ("gh", [q.pid for q in procs]), ("up", [ctx.upstream.pid]))}
        db_after = pg_db_stats(ctx)
        row = {"concurrency": level, **res}
        ok = res["ok"] or 1
        for k in ("pg", "gh", "up"):
            row[f"cpu_{k}_us"] = cpu_delta(cpu_before[k], cpu_after[k]) / CLK_TCK * 1e6 / ok
            row[f"cpu_{k}_cores"] = cpu_delta(cpu_before[k], cpu_after[k]) / CLK_TCK / max(res["wall"], 0.001)
        row["cpu_client_cores"] = client_s / max(res["wall"], 0.001)
        row["xacts_pgstat"] = (db_after[0] - db_before[0]) / ok if db_after and db_before else None
        row["xacts"] = row["xacts_pgstat"]
        row["tuples"] = (db_after[1] - db_before[1]) / ok if db_after and db_before else None
        if ctx.pg_statements:
            stats = stack.psql(ctx, "SELECT coalesce(sum(calls), 0), coalesce(sum(calls) FILTER (WHERE query ~* '^\\s*(begin|commit|rollback|start)'), 0) "
                              "FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = 'gatehouse' "
                              "AND query !~* 'pg_stat|pg_database|pg_backend_pid'")
            calls, control = (float(x) for x in stats.split("|"))
            begins = float(stack.psql(ctx, "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid "
                                     "WHERE d.datname = 'gatehouse' AND query ~* '^\\s*(begin|start)'") or 0)
            row["statements"] = (calls - control) / ok
            row["round_trips"] = calls / ok
            # Without BEGIN every statement is a transaction of its own; with it, at least the BEGINs.
            row["xacts"] = row["statements"] if begins == 0 else begins / ok
            row["xacts_explicit"] = begins > 0
            top_q = stack.psql(ctx, "SELECT calls, left(regexp_replace(query, '\\s+', ' ', 'g'), 90) FROM pg_stat_statements s "
                              "JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = 'gatehouse' AND query !~* 'pg_stat|pg_database|pg_backend_pid' "
                              "ORDER BY calls DESC LIMIT 8")
            row["top_statements"] = [line.split("|", 1) for line in top_q.splitlines() if "|" in line]
        row["waits"] = sampler.shares()
        row["saturation"] = saturation(row)
        r.capacity.append(row)
        print(f"    -> {res['ok']} refreshes ({res['errors']} errors{': ' + res['first_error'] if res['first_error'] else ''}), "
              f"{res['rate']:,.0f}/s, median {fmt_ms(res['p50'] or 0)} ms; waits {row['waits']}", file=sys.stderr)
        if res["rate"] < best * 1.05:
            say(f"capacity: {res['rate']:,.0f}/s at {level} is no more than 5 % above {best:,.0f}/s: saturated, no higher level")
            break
        best = max(best, res["rate"])
        pause(ctx.pause_s)
    for q in procs:
        ctx.children.stop(q)


def pg_db_stats(ctx):
    """(transactions, tuples) of the gatehouse database so far (pg_stat_database), or None."""
    try:
        out = stack.psql(ctx, "SELECT xact_commit + xact_rollback, tup_returned + tup_fetched + tup_inserted + tup_updated + tup_deleted "
                        "FROM pg_stat_database WHERE datname = 'gatehouse'")
        a, b = out.split("|")
        return int(a), int(b)
    except (RuntimeError, ValueError):
        return None
