"""The goals as data (GOALS: id, text, how the measured value comes from the results, threshold)
and the verdicts: `judge` judges one goal, `goals_table` is the report's last table. Each
`m_*` reads a Results (stats.py) and answers (value, text) or None when it was not measured."""

from dataclasses import dataclass

from .targets import FA_CACHED_RATIO


@dataclass(frozen=True)
class Goal:
    """id, text, how its measured value comes from the results (measure(results) -> (value, text)
    or None: not measured), and the threshold (`op`: ">=", "<=" or "<"; None: reported only)."""
    id: str
    text: str
    measure: object
    threshold: float | None
    op: str = ">="

    def met(self, value):
        """Whether a measured value meets the threshold (a goal with none is only reported)."""
        if self.op == ">=":
            return value >= self.threshold
        if self.op == "<":
            return value < self.threshold
        if self.op == "<=":
            return value <= self.threshold
        raise ValueError(f"goal {self.id}: unknown op {self.op!r}")


def ratio_of(results, target, side, ref, key="rps", ref_target=None):
    """side ÷ ref of one figure (requests/s, "rps", or CPU µs per request, "cpu") of a target (ref:
    of `ref_target`'s side when given, e.g. another target's Gatehouse row), or None unless both
    sides ran with valid runs."""
    s, r = results.side(target, side), results.side(ref_target or target, ref)
    if not s or not r or s.get(key) is None or not r.get(key) or not s["valid"] or not r["valid"]:
        return None
    return s[key] / r[key]


def m_ratio(target, ref, key="rps", unit="×"):
    """The measure of Gatehouse's side ÷ a reference's, for one target."""
    def measure(results):
        value = ratio_of(results, target, "gatehouse", ref, key)
        return None if value is None else (value, f"{value:.2f}{unit}")
    return measure


def m_p99_delta(results):
    """Gatehouse's passthrough p99 minus nginx's, in ms."""
    s, r = results.side("passthrough", "gatehouse"), results.side("passthrough", "nginx")
    if not s or not r or s.get("p99") is None or r.get("p99") is None:
        return None
    d = s["p99"] - r["p99"]
    return d, f"{d:+.2f} ms"


def m_access_log(results):
    """What the access log costs: 1 − (passthrough requests/s with it on ÷ with it off)."""
    value = ratio_of(results, "passthrough", "gatehouse", "access-log-off")
    if value is None:
        return None
    cost = 1 - value
    return cost, f"{cost * 100:.1f} % ({value:.2f}× the log-off rate)"


BEARER = "sealed-sqlite"   # the DPoP targets' comparison: the sealed bearer token on the same store


def m_bound(target):
    """The measure of a DPoP target's Gatehouse requests/s ÷ the sealed bearer token's (SQLite);
    when a side is invalid, from the medians as they are."""
    def measure(results):
        value = ratio_of(results, target, "gatehouse", "gatehouse", ref_target=BEARER)
        if value is None:
            b, s = results.side(target, "gatehouse"), results.side(BEARER, "gatehouse")
            if b and s and b.get("rps") and s.get("rps"):
                value = b["rps"] / s["rps"]
            else:
                return None
        return value, f"{value:.2f}×"
    return measure


def m_bound_cpu(target):
    """The measure of a DPoP target's Gatehouse CPU µs per request ÷ the sealed bearer token's
    (SQLite); both sides valid."""
    def measure(results):
        value = ratio_of(results, target, "gatehouse", "gatehouse", key="cpu", ref_target=BEARER)
        if value is None:
            return None
        b, s = results.side(target, "gatehouse"), results.side(BEARER, "gatehouse")
        return value, f"{value:.2f}× ({b['cpu']:.1f} / {s['cpu']:.1f} µs per request)"
    return measure


TOKEN_PASSTHROUGH_MS = 1.0   # passthrough refresh, sequential, SQLite: Gatehouse adds ≤ 1 ms to the direct median


def token_row(rows, store, mode, side):
    """One row of the token table (Results.token_rows) by its store, mode and side, or None."""
    return next((r for r in rows if (r.get("store"), r.get("mode"), r.get("side")) == (store, mode, side)), None)


def m_token_passthrough(results):
    """What Gatehouse adds to the median of a sequential passthrough refresh on SQLite, in ms; a
    row with errors misses (infinity)."""
    row = token_row(results.token_rows, "SQLite", "sequential", "passthrough app")
    if not row or row.get("overhead_ms") is None:
        return None
    base = token_row(results.token_rows, "SQLite", "sequential", "direct (upstream)")
    text = f"{row['overhead_ms']:+.2f} ms"
    if base and base.get("p50") is not None and row.get("p50") is not None:
        text += f" (median {row['p50']:.2f} vs {base['p50']:.2f} ms direct)"
    if row.get("errors"):
        return float("inf"), text + f"; {row['errors']} errors"
    return row["overhead_ms"], text


def m_token(results):
    """0 when every judged token-table row met its goal, else 1; the text names the worst row."""
    rows = results.token_rows
    if not rows:
        return None
    missed = [r for r in rows if r.get("met") is False]
    judged = [r for r in rows if r.get("met") is not None]
    if not judged:
        return None
    worst = max(judged, key=lambda r: r["overhead_pct"])
    text = f"worst {worst['overhead_pct']:+.0f} % / {worst['overhead_ms']:+.2f} ms ({worst['row']}); {len(missed)} of {len(judged)} rows over"
    return (0.0 if not missed else 1.0), text


def m_footprint(results):
    """The identity cache's MiB with 1,000,000 entries."""
    return None if results.footprint_mib is None else (results.footprint_mib, f"{results.footprint_mib:.1f} MiB")


def m_storm(results):
    """How many storms did not go as expected (refresh grants as expected, every request a 200)."""
    if not results.storms:
        return None
    wrong = [s for s in results.storms if s.get("refresh_grants") != s.get("expected_refresh_grants", 1)
             or s.get("ok") != s.get("requests")]
    return float(len(wrong)), f"{len(results.storms) - len(wrong)} of {len(results.storms)} storms as expected"


def m_fa_ratio(side):
    """The measure of a forward-auth row's requests/s ÷ nginx alone's."""
    def measure(results):
        value = ratio_of(results, "forward-auth", side, "nginx")
        if value is None:
            return None
        s, r = results.side("forward-auth", side), results.side("forward-auth", "nginx")
        return value, f"{value:.2f}× ({s['rps']:,.0f} / {r['rps']:,.0f} requests/s)"
    return measure


def fa_cpu(results):
    """(µs of Gatehouse CPU per decision in the uncached nginx row, µs per relayed request, where
    that comes from), or None. The relay figure: the forward-auth target's own Gatehouse relay row
    (the same instance, the same rounds), else the passthrough target's Gatehouse row."""
    decision = results.part("forward-auth", "nginx-auth", "gatehouse")
    if decision is None:
        return None
    for target, where in (("forward-auth", "the relay row of the same rounds"), ("passthrough", "the passthrough target's row")):
        s = results.side(target, "gatehouse")
        if s and s.get("cpu") is not None and s["valid"]:
            return decision, s["cpu"], where
    return None


def m_fa_cpu(results):
    """Gatehouse's CPU per decision ÷ per relayed request (fa_cpu)."""
    got = fa_cpu(results)
    if got is None:
        return None
    decision, relay, where = got
    return decision / relay, f"{decision:.1f} µs per decision vs {relay:.1f} µs per relayed request ({where}): {decision / relay:.2f}×"


def m_capacity(results):
    """The best sealed refresh rate over the capacity levels."""
    if not results.capacity:
        return None
    best = max(results.capacity, key=lambda level: level.get("rate") or 0)
    return best.get("rate") or 0.0, f"{best.get('rate', 0):,.0f} refreshes/s (at {best['concurrency']} concurrent)"


GOALS = [
    Goal("passthrough-haproxy", "passthrough GET requests/s ≥ 1.0× HAProxy (access log on)",
         m_ratio("passthrough", "haproxy"), 1.0),
    Goal("passthrough-nginx", "passthrough GET requests/s ≥ 0.8× nginx proxy_pass (access log on)",
         m_ratio("passthrough", "nginx"), 0.8),
    Goal("passthrough-p99", "passthrough GET p99 ≤ nginx's + 1 ms", m_p99_delta, 1.0, "<="),
    Goal("passthrough-cpu", "passthrough GET CPU µs per request ≤ 1.5× nginx's (access log on)",
         m_ratio("passthrough", "nginx", key="cpu"), 1.5, "<="),
    Goal("post-nginx", "POST 2 KiB JSON requests/s ≥ 0.7× nginx", m_ratio("post", "nginx"), 0.7),
    Goal("tls-nginx", "https backend requests/s ≥ 0.7× nginx", m_ratio("tls", "nginx"), 0.7),
    Goal("sealed-sqlite-nginx", "sealed (SQLite) requests/s ≥ 0.75× nginx", m_ratio("sealed-sqlite", "nginx"), 0.75),
    Goal("sealed-pg-nginx", "sealed (PostgreSQL) requests/s ≥ 0.75× nginx", m_ratio("sealed-pg", "nginx"), 0.75),
    Goal("access-log", "the access log costs ≤ 5 % of the passthrough requests/s with it off", m_access_log, 0.05, "<="),
    Goal("dpop", "DPoP-bound, replay protection by the store (every proof id written before the backend is asked): "
         "requests/s ÷ the sealed bearer token's (SQLite) (reported)", m_bound("dpop"), None),
    Goal("dpop-nonce", "DPoP-bound, instance nonces (no store write per request): requests/s ≥ 0.6× the sealed bearer "
         "token's (SQLite)", m_bound("dpop-nonce"), 0.6),
    Goal("dpop-nonce-cpu", "DPoP-bound, instance nonces: Gatehouse CPU µs per request ≤ 2× the sealed bearer token's (SQLite)",
         m_bound_cpu("dpop-nonce"), 2.0, "<="),
    Goal("token-overhead", "the token endpoint adds ≤ 20 % or ≤ 0.5 ms to the direct refresh, every row",
         m_token, 0.0, "<="),
    Goal("token-passthrough-sqlite", f"passthrough refresh, sequential, SQLite: Gatehouse adds ≤ +{TOKEN_PASSTHROUGH_MS:g} ms "
         "to the direct call (median)", m_token_passthrough, TOKEN_PASSTHROUGH_MS, "<="),
    Goal("footprint", "identity cache with 1,000,000 entries ≤ 300 MiB", m_footprint, 300.0, "<="),
    Goal("storm", "refresh storm: exactly one upstream refresh per expired storm, none in the control, all 200",
         m_storm, 0.0, "<="),
    Goal("forward-auth-cached", f"nginx + cached auth_request → Gatehouse requests/s ≥ {FA_CACHED_RATIO:g}× nginx alone",
         m_fa_ratio("nginx-auth-cached"), FA_CACHED_RATIO),
    Goal("forward-auth-cpu", "µs of Gatehouse CPU per decision (nginx auth_request, uncached) < µs per relayed request",
         m_fa_cpu, 1.0, "<"),
    Goal("forward-auth-uncached", "nginx + auth_request → Gatehouse, uncached: requests/s ÷ nginx alone (reported)",
         m_fa_ratio("nginx-auth"), None),
    Goal("forward-auth-caddy", "Caddy + forward_auth → Gatehouse: requests/s ÷ nginx alone (reported)",
         m_fa_ratio("caddy-auth"), None),
    Goal("capacity", "sealed refreshes/s, two instances on one PostgreSQL (reported, no threshold)", m_capacity, None),
]

TOKEN_GOAL_PCT, TOKEN_GOAL_MS = 20.0, 0.5   # a token-endpoint row: Gatehouse adds ≤ 20 % or ≤ 0.5 ms


def token_overhead(res, base, concurrent):
    """What Gatehouse adds to a refresh, one token-table row (`res`) against the direct refresh of the
    same store and mode (`base`), both refresh_load results: overhead_ms and overhead_pct of the
    median (concurrent: the pct is also the rate's shortfall, whichever is worse), rate_ratio, and
    met (≤ TOKEN_GOAL_PCT % or ≤ TOKEN_GOAL_MS ms, and no errors). {} when either side refreshed
    nothing."""
    if not res["ok"] or not base["ok"]:
        return {}
    row = {"overhead_ms": res["p50"] - base["p50"],
           "overhead_pct": (res["p50"] / base["p50"] - 1) * 100 if base["p50"] else 0.0}
    if concurrent and base["rate"] and res["rate"]:
        row["rate_ratio"] = res["rate"] / base["rate"]
        row["overhead_pct"] = max(row["overhead_pct"], (base["rate"] / res["rate"] - 1) * 100)
    row["met"] = not res["errors"] and (row["overhead_pct"] <= TOKEN_GOAL_PCT or row["overhead_ms"] <= TOKEN_GOAL_MS)
    return row


def judge(goal, results):
    """(measured text, verdict) of one goal: ("not measured", "not measured") when its target did not
    run or a side it compares failed; else its text and "met", "**missed**" or "reported"."""
    try:
        measured = goal.measure(results)
    except (KeyError, TypeError, ZeroDivisionError):
        measured = None
    if measured is None:
        return "not measured", "not measured"
    value, text = measured
    if goal.threshold is None:
        return text, "reported"
    return text, "met" if goal.met(value) else "**missed**"


def goals_table(results):
    """The report's goals table: every goal, its measured value and its verdict."""
    out = ["### Goals", "", "| goal | measured | verdict |", "|---|---|---|"]
    for g in GOALS:
        text, verdict = judge(g, results)
        out.append(f"| {g.text} (`{g.id}`) | {text} | {verdict} |")
    return "\n".join(out) + "\n"
