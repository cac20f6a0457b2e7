"""The report's tables, from the Results: the main table (each wrk target, Gatehouse against nginx,
with its goal), the bound tokens against the bearer token, the forward-auth table, Gatehouse
against each reference proxy, the token endpoint's overhead and the refresh capacity."""

from .goals import BEARER, GOALS, TOKEN_GOAL_MS, TOKEN_GOAL_PCT, TOKEN_PASSTHROUGH_MS, fa_cpu, judge, token_row
from .stats import SPREAD_FLAG, fmt_ms, mib, spread_text
from .targets import FA_CACHED_RATIO, FA_MAX_AGE, FRONT, FRONTS, GH_ROW, PEER, TARGET


EXPLAIN = ("Medians over the runs of each side. spread = (max − min) / median of requests/s. CPU = Δ(utime + stime) of the proxy's "
           "processes (Gatehouse's process; nginx's master and workers; HAProxy's and Caddy's process) over each run ÷ its requests "
           "(the backend's CPU is in none). INVALID: a run with a wrong or unchecked body or non-2xx answers; its numbers do not count.")


def run_notes(who, s):
    """The notes of one side's runs: each INVALID run with its problems, and its socket lines."""
    return ([f"- {who}, run {round_}: INVALID: " + "; ".join(problems) for round_, problems in s["invalid"]]
            + [f"- {who}, {line}" for line in s.get("socket") or []])


def main_table(ctx, targets):
    """The main table: each wrk target's Gatehouse rows against nginx, with the goal and the result,
    then the notes, the comparisons and the instances' memory."""
    r = ctx.results
    out = ["| target | goal | nginx req/s | Gatehouse req/s | spread nginx / GH | ratio | p50 ms nginx / GH | p99 ms nginx / GH "
           "| p99 Δ ms | CPU µs/req nginx / GH | CPU ratio (≤ 1.5) | result |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    notes, lines = [], []
    for t in targets:
        ref = r.side(t.name, "nginx")
        goal = ("none" if t.ratio is None else f"≥ {t.ratio:.2f}×") + (f", p99 ≤ nginx + {t.p99_ms:g} ms" if t.p99_ms else "")
        sides = ["gatehouse"] + [row for row in t.rows if (t.name, row) in r.runs or (t.name, row) in r.failed]
        for side in sides:
            label = t.label + ("" if side == "gatehouse" else f" ({GH_ROW[side].label})")
            gh = r.side(t.name, side)
            ref_failed, gh_failed = r.failed.get((t.name, "nginx")), r.failed.get((t.name, side))
            c = dict.fromkeys(("ref", "gh", "ratio", "p50", "p99", "delta", "cpu", "cpu_ratio"), "-")
            has_ref, has_gh = bool(ref and ref.get("rps") is not None), bool(gh and gh.get("rps") is not None)
            if has_ref:
                c["ref"] = f"{ref['rps']:,.0f}" + ("" if ref["valid"] else " (INVALID)")
            if has_gh:
                c["gh"] = f"{gh['rps']:,.0f}" + ("" if gh["valid"] else " (INVALID)")
            elif gh_failed:
                c["gh"] = "skipped" if gh_failed.startswith("skipped") else "FAILED"
            elif ctx.nginx_only:
                c["gh"] = "not run"
            ratio = delta = None
            if has_ref:
                c["p50"] = f"{fmt_ms(ref['p50'])} / " + (fmt_ms(gh["p50"]) if has_gh else "-")
                c["p99"] = f"{fmt_ms(ref['p99'])} / " + (fmt_ms(gh["p99"]) if has_gh else "-")
            if has_ref and has_gh:
                ratio = gh["rps"] / ref["rps"] if ref["rps"] else None
                delta = gh["p99"] - ref["p99"]
                c["ratio"] = f"{ratio:.2f}×" if ratio is not None else "n/a"
                c["delta"] = f"{delta:+.2f}"
            rc, gc = (ref or {}).get("cpu"), (gh or {}).get("cpu")
            if rc is not None or gc is not None:
                c["cpu"] = (f"{rc:.1f}" if rc is not None else "-") + " / " + (f"{gc:.1f}" if gc is not None else "-")
            if rc and gc is not None:
                c["cpu_ratio"] = f"{gc / rc:.2f}× " + ("met" if gc / rc <= 1.5 else "missed")
            if gh_failed:
                result = "skipped" if gh_failed.startswith("skipped") else "FAILED"
                notes.append(f"- {label}: Gatehouse {result} ({gh_failed})")
            elif ref_failed and not (has_ref and has_gh):
                result = "FAILED (nginx)"
                notes.append(f"- {label}: the nginx reference FAILED ({ref_failed})")
            elif ctx.nginx_only:
                result = "not run (nginx only)"
            elif not (has_ref and has_gh):
                result = "no result"
            elif not gh["valid"] or not ref["valid"]:
                result = "INVALID (see below)"
            elif t.ratio is None or side != "gatehouse":
                result = "reported"
            else:
                missed = []
                if ratio is None or ratio < t.ratio:
                    missed.append(f"ratio {ratio:.2f} < {t.ratio:.2f}" if ratio is not None else "ratio n/a")
                if t.p99_ms and delta > t.p99_ms:
                    missed.append(f"p99 {delta:+.2f} ms > +{t.p99_ms:g} ms")
                result = "met" if not missed else "missed (" + "; ".join(missed) + ")"
                if gh["spread"] > SPREAD_FLAG or ref["spread"] > SPREAD_FLAG:
                    result += ", noisy (spread > 10 %)"
            out.append(f"| {label} | {goal if side == 'gatehouse' else '-'} | {c['ref']} | {c['gh']} | {spread_text(ref)} / "
                       f"{spread_text(gh)} | {c['ratio']} | {c['p50']} | {c['p99']} | {c['delta']} | {c['cpu']} | {c['cpu_ratio']} | {result} |")
            for who, s in (("nginx", ref), (side, gh)):
                if who == "nginx" and side != "gatehouse" or not s:
                    continue
                notes += run_notes(f"{label}, {who}", s)
            if has_gh:
                extra = []
                if gh.get("identity_calls") is not None:
                    flag = "" if gh["identity_calls"] == 0 else " (expected 0: the identity cache did not absorb the look-ups)"
                    extra.append(f"identity-service calls during its loads {gh['identity_calls']}{flag}")
                if gh.get("refresh_grants") is not None:
                    extra.append(f"upstream refresh grants during its loads {gh['refresh_grants']}" + ("" if gh["refresh_grants"] == 0 else " (expected 0)"))
                extra.append(f"body checks {gh['checked']} of {gh['responses']:,} responses"
                             + (f", nginx {ref['checked']} of {ref['responses']:,}" if has_ref else ""))
                extra.append("req/s per run nginx " + " / ".join(f"{x:,.0f}" for x in (ref or {}).get("all_rps", []))
                             + f", {side} " + " / ".join(f"{x:,.0f}" for x in gh["all_rps"]))
                notes.append(f"- {label}: " + "; ".join(extra))
            elif has_ref and side == "gatehouse":
                notes.append(f"- {label}: req/s per run nginx " + " / ".join(f"{x:,.0f}" for x in ref["all_rps"])
                             + f"; body checks {ref['checked']} of {ref['responses']:,} responses")
    cur, base = r.side("passthrough", "gatehouse"), r.side("passthrough", "baseline")
    if ("passthrough", "baseline") in r.runs or ("passthrough", "baseline") in r.failed:
        if cur and base and cur.get("rps") and base.get("rps"):
            lines.append(f"- current vs baseline binary (passthrough GET): requests/s {cur['rps'] / base['rps']:.2f}× "
                         f"({cur['rps']:,.0f} / {base['rps']:,.0f}), p50 {cur['p50'] - base['p50']:+.3f} ms, p99 {cur['p99'] - base['p99']:+.2f} ms")
        else:
            lines.append("- current vs baseline binary: n/a (a row failed)")
    off = r.side("passthrough", "access-log-off")
    if cur and off and cur.get("rps") and off.get("rps"):
        cpu = (f", CPU {cur['cpu'] - off['cpu']:+.1f} µs/request" if cur.get("cpu") is not None and off.get("cpu") is not None else "")
        lines.append(f"- access log on vs off (passthrough GET): requests/s {cur['rps'] / off['rps']:.2f}× "
                     f"({cur['rps']:,.0f} / {off['rps']:,.0f}), p99 {cur['p99'] - off['p99']:+.2f} ms{cpu}")
    for sealed in ("sealed-sqlite", "sealed-pg"):
        s = r.side(sealed, "gatehouse")
        if s and s.get("rps") and cur and cur.get("rps"):
            lines.append(f"- {TARGET[sealed].label} vs passthrough GET (Gatehouse): requests/s {s['rps'] / cur['rps']:.2f}×, "
                         f"p99 {s['p99'] - cur['p99']:+.2f} ms")
    direct = r.side("direct", "nginx")
    if direct and direct.get("rps") is not None:
        lines.append(f"- nginx direct (wrk → backend, no proxy; the ceiling): {direct['rps']:,.0f} requests/s, p50 {fmt_ms(direct['p50'])} ms, "
                     f"p99 {fmt_ms(direct['p99'])} ms" + (f", backend CPU {direct['cpu']:.1f} µs/request" if direct.get("cpu") is not None else "")
                     + ("" if direct["valid"] else " (INVALID: " + "; ".join(p for _, ps in direct["invalid"] for p in ps) + ")"))
    for text in r.notes:
        lines.append(f"- {text}")
    for text in r.peer_notes.values():
        lines.append(f"- {text}")
    body = ("\n".join(out) + "\n\n" + EXPLAIN + "\n") if targets else ""
    if lines or notes:
        body += ("\n" if body else "") + "\n".join(lines + notes) + "\n"
    if r.instances:
        body += ("\n| Gatehouse instance | targets | start to ready | VmRSS at ready (idle) | VmRSS under load (max sampled) | VmHWM after its loads |\n"
                 "|---|---|---:|---:|---:|---:|\n")
        for inst in r.instances:
            mine = [x for runs in r.runs.values() for x in runs if x.get("instance") == inst["name"]]
            rss_max = max((x["rss_max_kib"] for x in mine if x.get("rss_max_kib")), default=None)
            hwm = max((x["hwm_kib"] for x in mine if x.get("hwm_kib")), default=None)
            body += (f"| {inst['name']} | {inst['targets']} | {inst['ready_ms']} ms | {mib(inst['rss_ready_kib'])} | "
                     f"{mib(rss_max)} | {mib(hwm)} |\n")
    return body


BOUND_ROWS = [  # (target, row, replay protection, its goal ids)
    (BEARER, "sealed bearer token (`gha_`)", "none (a bearer token has no proof)", ()),
    ("dpop", "DPoP-bound (`ghd_`), store", "the store: every proof id written before the backend is asked", ("dpop",)),
    ("dpop-nonce", "DPoP-bound (`ghd_`), instance nonces", "the instance's own jti set (it accepts only its nonces): no store write",
     ("dpop-nonce", "dpop-nonce-cpu")),
]


def bound_table(results):
    """The bound tokens against the sealed bearer token (all on SQLite), a row per target that ran
    or failed: Gatehouse's requests/s, CPU µs per request and p50/p99, each × the bearer row, and
    the goals' verdicts; "" when no DPoP target ran."""
    r = results
    if not any((t, "gatehouse") in r.runs or (t, "gatehouse") in r.failed for t, *_ in BOUND_ROWS[1:]):
        return ""
    out = ["### Bound tokens: DPoP against the bearer token (sealed, SQLite)", "",
           "Gatehouse's rows of the targets `sealed-sqlite`, `dpop` and `dpop-nonce` (each its own instance, same configuration "
           "but for `dpop:`; a fresh proof per request, made beforehand; nginx's rows of the same rounds in the main table).", "",
           "| row | replay protection | req/s | × bearer | CPU µs/req | CPU × bearer | p50 ms | p99 ms | goal | result |",
           "|---|---|---:|---:|---:|---:|---:|---:|---|---|"]
    notes = []
    bearer = r.side(BEARER, "gatehouse")
    goal_of = {g.id: g for g in GOALS}
    for target, label, replay, goal_ids in BOUND_ROWS:
        s, failed = r.side(target, "gatehouse"), r.failed.get((target, "gatehouse"))
        if s is None and not failed:
            continue
        has = bool(s and s.get("rps") is not None)
        has_bearer = bool(bearer and bearer.get("rps"))
        cpu = s.get("cpu") if has else None
        bearer_cpu = bearer.get("cpu") if has_bearer else None
        cells = [label, replay,
                 (f"{s['rps']:,.0f}" + ("" if s["valid"] else " (INVALID)")) if has else ("skipped" if (failed or "").startswith("skipped") else "FAILED" if failed else "-"),
                 f"{s['rps'] / bearer['rps']:.2f}×" if has and has_bearer and target != BEARER else "-",
                 f"{cpu:.1f}" if cpu is not None else "-",
                 f"{cpu / bearer_cpu:.2f}×" if cpu is not None and bearer_cpu and target != BEARER else "-",
                 fmt_ms(s["p50"]) if has else "-", fmt_ms(s["p99"]) if has else "-"]
        if target == BEARER:
            goal, result = "reference", "reference"
        else:
            verdicts = [(goal_of[g], judge(goal_of[g], r)) for g in goal_ids]
            goal = "; ".join(goal_text(g) for g, _ in verdicts)
            result = "; ".join(verdict.strip("*") + ("" if verdict in ("met", "reported", "not measured") else f" ({text})")
                               for _, (text, verdict) in verdicts)
        if failed:
            result = "skipped" if failed.startswith("skipped") else "FAILED"
            notes.append(f"- {label}: {result} ({failed.removeprefix('skipped: ')})")
        out.append("| " + " | ".join(cells + [goal, result]) + " |")
        if s:
            notes += run_notes(label, s)
    return "\n".join(out) + "\n" + ("\n" + "\n".join(notes) + "\n" if notes else "")


def goal_text(goal):
    """A bound row's goal, short: ≥ 0.6× req/s, ≤ 2× CPU, or reported."""
    if goal.threshold is None:
        return "reported"
    what = "CPU" if goal.id.endswith("-cpu") else "req/s"
    return f"{ {'>=': '≥', '<=': '≤'}.get(goal.op, goal.op)} {goal.threshold:g}× {what}"


def forward_auth_table(ctx):
    """The forward-auth table: nginx alone, the fronts and Gatehouse's relay, in the same rounds."""
    r = ctx.results
    t = TARGET["forward-auth"]
    ref = r.side(t.name, "nginx")
    out = ["### Forward auth: an ingress asking Gatehouse, against Gatehouse's own relay", "",
           "`GET /api/data` with the passthrough bearer token (none for nginx alone), each row in the same rounds, to the same nginx "
           "backend: nginx alone (`proxy_pass`, the reference); nginx with `auth_request` to Gatehouse's `/forward-auth` (upstream "
           "`keepalive 64`, no request body, `X-Original-URI`/`-Method`), asking on every request, then keeping Gatehouse's allows in a "
           "`proxy_cache` keyed by the token, the method and the URI for its `X-Accel-Expires` (`forward_auth.max_age: "
           f"{FA_MAX_AGE}`, `proxy_cache_lock on`, the cache on tmpfs); Caddy with `forward_auth` (keep-alive) then `reverse_proxy`; "
           "Gatehouse relaying itself. One Gatehouse instance (`gatehouse.yaml.in` + `gatehouse-forward-auth.yaml.in`) decides for "
           "every front and is the relay row. The fronts set X-BPId, X-Subject and Authorization from Gatehouse's answer only. CPU: "
           "the row's proxy processes and Gatehouse's together, then Gatehouse's alone, µs per request.", "",
           "| row | goal | req/s | spread | × nginx alone | p50 ms | p99 ms | CPU µs/req | of which Gatehouse | result |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    rows = [("nginx", "nginx alone (proxy_pass)")] + [(f.name, f.label) for f in FRONTS if f.name in t.fronts] \
        + [("gatehouse", "Gatehouse relay (passthrough)")]
    notes = []
    for side, label in rows:
        s = r.side(t.name, side)
        failed = r.failed.get((t.name, side))
        has = bool(s and s.get("rps") is not None)
        has_ref = bool(ref and ref.get("rps"))
        goal = "reference" if side == "nginx" else f"≥ {FA_CACHED_RATIO:g}× nginx alone" if side == "nginx-auth-cached" else "none"
        ratio = s["rps"] / ref["rps"] if has and has_ref and side != "nginx" else None
        gh_cpu = r.part(t.name, side, "gatehouse") if side in FRONT else s.get("cpu") if has and side == "gatehouse" else None
        if failed:
            result = "skipped" if failed.startswith("skipped") else "FAILED"
            notes.append(f"- {label}: {result} ({failed.removeprefix('skipped: ')})")
        elif ctx.nginx_only and side != "nginx":
            result = "not run (nginx only)"
        elif not has:
            result = "no result"
        elif not s["valid"] or (side == "nginx-auth-cached" and not ref["valid"]):
            result = "INVALID (see below)"
        elif side == "nginx":
            result = "reference"
        elif side == "nginx-auth-cached":
            if ratio is None:
                result = "no result (nginx alone did not run)"
            else:
                result = "met" if ratio >= FA_CACHED_RATIO else f"missed ({ratio:.2f} < {FA_CACHED_RATIO:g})"
                if s["spread"] > SPREAD_FLAG or ref["spread"] > SPREAD_FLAG:
                    result += ", noisy (spread > 10 %)"
        else:
            result = "reported"
        rps = (f"{s['rps']:,.0f}" + ("" if s["valid"] else " (INVALID)")) if has else result if failed or ctx.nginx_only else "-"
        cells = [label, goal, rps, spread_text(s), f"{ratio:.2f}×" if ratio is not None else "-",
                 fmt_ms(s["p50"]) if has else "-", fmt_ms(s["p99"]) if has else "-",
                 f"{s['cpu']:.1f}" if has and s.get("cpu") is not None else "-",
                 f"{gh_cpu:.1f}" if gh_cpu is not None else "-", result]
        out.append("| " + " | ".join(cells) + " |")
        if s:
            notes += run_notes(label, s)
        if has:
            extra = []
            if s.get("identity_calls") is not None:
                extra.append(f"identity-service calls during its loads {s['identity_calls']}"
                             + ("" if s["identity_calls"] == 0 else " (expected 0: the identity cache did not absorb the look-ups)"))
            proxy = r.part(t.name, side, "proxy")
            if proxy is not None:
                extra.append(f"the proxy's own CPU {proxy:.1f} µs/request")
            extra.append(f"body checks {s['checked']} of {s['responses']:,} responses")
            extra.append("req/s per run " + " / ".join(f"{x:,.0f}" for x in s["all_rps"]))
            notes.append(f"- {label}: " + "; ".join(extra))
    lines = []
    got = fa_cpu(r)
    if got:
        decision, relay, where = got
        lines.append(f"- Gatehouse CPU per decision (nginx auth_request, uncached): {decision:.1f} µs; per relayed request ({where}): "
                     f"{relay:.1f} µs; {decision / relay:.2f}× (goal < 1: {'met' if decision < relay else '**missed**'})")
        cached = r.part(t.name, "nginx-auth-cached", "gatehouse")
        if cached is not None and decision:
            lines.append(f"- cached nginx front: Gatehouse CPU {cached:.2f} µs per request, {cached / decision * 100:.1f} % of an "
                         f"uncached decision's (a decision per token, method and URI when its entry expires: every {FA_MAX_AGE} at most)")
    if r.fa_decision:
        lines.append(f"- Gatehouse's answer to a decision asked directly before the load, as the nginx front asks it: {r.fa_decision}")
    if r.fa_refusal:
        lines.append(f"- the same without a token: {r.fa_refusal}")
    lines += [f"- {n}" for n in r.fa_notes]
    return "\n".join(out) + "\n\n" + "\n".join(lines + notes) + "\n"


def peers_table(ctx, targets):
    """Gatehouse against each reference proxy: requests/s, CPU and context switches, per target and peer."""
    r = ctx.results
    out = ["| target | reference | its req/s | its CPU µs/req | Gatehouse req/s | Gatehouse CPU µs/req | req/s ratio (GH ÷ it) "
           "| CPU ratio (GH ÷ it) | context switches/req it / GH |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    any_row = False
    for t in targets:
        if len(t.peers) < 2:
            continue
        gh = r.side(t.name, "gatehouse")
        for name in t.peers:
            if name not in ctx.peer_names:
                continue
            ref = r.side(t.name, name)
            failed = r.failed.get((t.name, name))
            if not ref and not failed:
                continue
            any_row = True
            has_ref = bool(ref and ref.get("rps") is not None)
            has_gh = bool(gh and gh.get("rps") is not None)
            cells = [t.label, PEER[name].label,
                     (f"{ref['rps']:,.0f}" + ("" if ref["valid"] else " (INVALID)")) if has_ref else ("FAILED" if failed else "-"),
                     f"{ref['cpu']:.1f}" if has_ref and ref.get("cpu") is not None else "-",
                     f"{gh['rps']:,.0f}" if has_gh else "-",
                     f"{gh['cpu']:.1f}" if has_gh and gh.get("cpu") is not None else "-",
                     f"{gh['rps'] / ref['rps']:.2f}×" if has_ref and has_gh and ref["rps"] else "-",
                     f"{gh['cpu'] / ref['cpu']:.2f}×" if has_ref and has_gh and ref.get("cpu") and gh.get("cpu") is not None else "-",
                     " / ".join(f"{side['switches']:.2f}" if side and side.get("switches") is not None else "-" for side in (ref, gh))]
            out.append("| " + " | ".join(cells) + " |")
    if not any_row:
        return ""
    return "\n".join(out) + "\n\nEach reference proxies to the same nginx backend, in the same rounds as Gatehouse (access log on). " \
        "HAProxy: `http-reuse always`, keep-alive to the backend, one thread per nginx worker; Caddy: `reverse_proxy` with keep-alive, " \
        "admin endpoint off, no automatic HTTPS, GOMAXPROCS = nginx's workers. Context switches: voluntary and involuntary, " \
        "of every thread of the proxy's processes (/proc), over the run ÷ its requests.\n"


def token_table(ctx):
    """The token endpoint's rows: direct, passthrough app and sealed app, sequential and concurrent."""
    r = ctx.results
    out = ["### Token endpoint: a refresh through Gatehouse vs sent directly to the upstream", "",
           f"`grant_type=refresh_token`: directly to the upstream's token endpoint with the upstream client's credentials (HTTP Basic, "
           f"as Gatehouse sends it), and through Gatehouse's `/oauth/token` for the passthrough app (relayed to the upstream) and the "
           f"sealed app (Gatehouse rotates its own refresh token in its store; no upstream call). Sequential: {ctx.token_sequential} "
           f"refreshes on one chain; concurrent: {ctx.token_concurrency} chains for {ctx.duration} s. One Python client (threads, "
           f"keep-alive http.client) for every row. Goal per row: Gatehouse adds ≤ {TOKEN_GOAL_PCT:g} % or ≤ {TOKEN_GOAL_MS:g} ms to "
           "the direct median (concurrent: also the rate's shortfall in %); the passthrough app, sequential, on SQLite: also "
           f"≤ +{TOKEN_PASSTHROUGH_MS:g} ms (`token-passthrough-sqlite`). Sequential rows run in turn, in slices (interleaved)"
           + (f"; the baseline binary's passthrough row (`BASELINE_BIN`, its own instance, same configuration) among them, on SQLite"
              if ctx.baseline else "") + ".", "",
           "| store | mode | row | refreshes | errors | refreshes/s | median ms | p99 ms | vs direct | result |",
           "|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for row in r.token_rows:
        vs = "-"
        if row.get("overhead_ms") is not None:
            vs = f"{row['overhead_ms']:+.2f} ms, {row['overhead_pct']:+.0f} %" + (f", rate {row['rate_ratio']:.2f}×" if row.get("rate_ratio") else "")
        result = "reported (baseline binary)" if row.get("baseline") else "-" if row.get("met") is None else ("met" if row["met"] else "missed")
        out.append(f"| {row['store']} | {row['mode']} | {row['side']} | {row['ok']:,} | {row['errors']} | {row['rate']:,.0f} | "
                   f"{fmt_ms(row['p50']) if row['p50'] is not None else '-'} | {fmt_ms(row['p99']) if row['p99'] is not None else '-'} | {vs} | {result} |")
        if row.get("first_error"):
            r.token_notes.append(f"- {row['row']}: first error: {row['first_error']}")
    line = token_baseline_line(r.token_rows)
    return "\n".join(out + [""] + ([line] if line else []) + r.token_notes) + "\n"


def token_baseline_line(rows):
    """The current binary's sequential passthrough refresh on SQLite against the baseline binary's,
    or None when the baseline row did not run."""
    base = next((row for row in rows if row.get("baseline") and row.get("store") == "SQLite" and row.get("mode") == "sequential"), None)
    cur = token_row(rows, "SQLite", "sequential", "passthrough app")
    if not base:
        return None
    if not cur or cur.get("p50") is None or base.get("p50") is None:
        return "- current vs baseline binary (passthrough refresh, sequential, SQLite): n/a (a row refreshed nothing)"
    return (f"- current vs baseline binary (passthrough refresh, sequential, SQLite): median {cur['p50']:.3f} vs {base['p50']:.3f} ms "
            f"({cur['p50'] - base['p50']:+.3f} ms), p99 {cur['p99']:.3f} vs {base['p99']:.3f} ms")


def capacity_table(ctx):
    """The capacity levels: rate, latency, statements, CPU and PostgreSQL's backends' states."""
    r = ctx.results
    out = ["### Capacity: sealed refreshes, two instances on one PostgreSQL", "",
           f"Sealed refresh chains (`/oauth/token`, `grant_type=refresh_token`, com.example.app) spread over both instances, "
           f"{ctx.duration} s per level, the concurrency raised until the rate stops rising (< 5 % more). Per refresh: SQL statements "
           "(pg_stat_statements, without BEGIN/COMMIT), round trips (every statement, BEGIN/COMMIT included: one Sync each), "
           "transactions, CPU µs of PostgreSQL (postmaster and backends), of both Gatehouse processes, of the "
           "upstream (idle: a sealed refresh does not call it). PostgreSQL backends' state sampled from pg_stat_activity every 100 ms.", "",
           "| concurrent | refreshes/s | median ms | p99 ms | errors | statements | round trips | transactions | CPU µs PG / GH / upstream "
           "| cores PG / GH / client | PG backends: CPU / Lock / IO / other wait / idle in xact / idle (waiting for Gatehouse) | saturates at |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for row in r.capacity:
        w = row["waits"]
        fmt = lambda v: f"{v:.1f}" if v is not None else "n/a"  # noqa: E731
        out.append(f"| {row['concurrency']} | {row['rate']:,.0f} | {fmt_ms(row['p50'] or 0)} | {fmt_ms(row['p99'] or 0)} | "
                   f"{row['errors']} | {fmt(row.get('statements'))} | {fmt(row.get('round_trips'))} | {fmt(row.get('xacts'))} | "
                   f"{row['cpu_pg_us']:.0f} / {row['cpu_gh_us']:.0f} / {row['cpu_up_us']:.0f} | {row['cpu_pg_cores']:.2f} / {row['cpu_gh_cores']:.2f} / "
                   f"{row.get('cpu_client_cores', 0):.2f} | "
                   f"{w.get('CPU', 0):.0f} % / {w.get('Lock', 0):.0f} % / {w.get('IO', 0):.0f} % / "
                   f"{sum(v for k, v in w.items() if k not in ('CPU', 'Lock', 'IO', 'idle', 'idle in transaction')):.0f} % / "
                   f"{w.get('idle in transaction', 0):.0f} % / "
                   f"{w.get('idle', 0):.0f} % | {row['saturation']} |")
    notes = list(r.capacity_notes)
    if r.capacity:
        notes.append("- transactions: with no BEGIN in pg_stat_statements every statement is a transaction of its own (the count "
                     "shown); with BEGINs, the BEGINs. pg_stat_database's xact_commit per refresh (it lags: idle backends report "
                     "their counters late): " + ", ".join(f"{x['xacts_pgstat']:.1f}" if x.get("xacts_pgstat") is not None else "n/a"
                                                        for x in r.capacity))
    if r.capacity and r.capacity[-1].get("top_statements"):
        notes.append(f"- the most frequent statements at {r.capacity[-1]['concurrency']} concurrent (calls in {ctx.duration} s):")
        for calls, query in r.capacity[-1]["top_statements"]:
            notes.append(f"  - {calls} × `{query.strip()}`")
    for row in r.capacity:
        if row.get("first_error"):
            notes.append(f"- {row['concurrency']} concurrent: first error: {row['first_error']}")
    return "\n".join(out + [""] + notes) + "\n"
