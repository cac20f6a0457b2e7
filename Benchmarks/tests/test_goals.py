"""The goals table and its verdicts, and the token endpoint's overhead (bench.goals)."""

import pytest

from bench.goals import GOALS, Goal, goals_table, judge, ratio_of, token_overhead
from bench.stats import Results
from conftest import wrk_run


def passthrough(gh_rps, nginx_rps, gh_p99=2.0, nginx_p99=1.5, gh_cpu=40.0, nginx_cpu=30.0, **more):
    r = Results()
    r.runs[("passthrough", "gatehouse")] = [wrk_run(gh_rps, p99=gh_p99, cpu=gh_cpu)]
    r.runs[("passthrough", "nginx")] = [wrk_run(nginx_rps, p99=nginx_p99, cpu=nginx_cpu)]
    for (target, side), rps in more.get("others", {}).items():
        r.runs[(target, side)] = [wrk_run(rps)]
    return r


def goal(goal_id):
    return next(g for g in GOALS if g.id == goal_id)


def test_the_goals_have_unique_ids_and_known_operators():
    ids = [g.id for g in GOALS]
    assert len(ids) == len(set(ids))
    assert {g.op for g in GOALS} <= {">=", "<=", "<"}


@pytest.mark.parametrize("op, value, met", [(">=", 0.8, True), (">=", 0.79, False), ("<=", 1.0, True), ("<=", 1.01, False),
                                            ("<", 0.99, True), ("<", 1.0, False)])
def test_goal_met(op, value, met):
    threshold = 0.8 if op == ">=" else 1.0
    assert Goal("g", "text", None, threshold, op).met(value) is met


def test_ratio_of_needs_both_sides_valid():
    r = passthrough(800, 1000)
    assert ratio_of(r, "passthrough", "gatehouse", "nginx") == pytest.approx(0.8)
    assert ratio_of(r, "passthrough", "gatehouse", "nginx", key="cpu") == pytest.approx(40 / 30)
    assert ratio_of(r, "passthrough", "gatehouse", "haproxy") is None
    r = passthrough(800, 1000)
    r.runs[("passthrough", "nginx")].append(wrk_run(1000, round_=2, non2xx=1))
    assert ratio_of(r, "passthrough", "gatehouse", "nginx") is None


def test_passthrough_verdicts():
    r = passthrough(850, 1000, gh_p99=3.0, nginx_p99=1.5, gh_cpu=60.0, nginx_cpu=30.0)
    assert judge(goal("passthrough-nginx"), r) == ("0.85×", "met")
    assert judge(goal("passthrough-p99"), r) == ("+1.50 ms", "**missed**")
    assert judge(goal("passthrough-cpu"), r) == ("2.00×", "**missed**")
    assert judge(goal("passthrough-haproxy"), r) == ("not measured", "not measured")
    assert judge(goal("post-nginx"), r) == ("not measured", "not measured")


def test_access_log_cost():
    r = passthrough(960, 1000, others={("passthrough", "access-log-off"): 1000})
    assert judge(goal("access-log"), r) == ("4.0 % (0.96× the log-off rate)", "met")
    r = passthrough(900, 1000, others={("passthrough", "access-log-off"): 1000})
    assert judge(goal("access-log"), r)[1] == "**missed**"


def bound(dpop_rps=None, nonce_rps=None, bearer_rps=1000, dpop_cpu=None, nonce_cpu=None, bearer_cpu=None, **invalid):
    """Results of the bearer token (sealed-sqlite) and the DPoP targets' Gatehouse rows."""
    r = Results()
    r.runs[("sealed-sqlite", "gatehouse")] = [wrk_run(bearer_rps, cpu=bearer_cpu, **invalid.get("bearer", {}))]
    if dpop_rps is not None:
        r.runs[("dpop", "gatehouse")] = [wrk_run(dpop_rps, cpu=dpop_cpu, **invalid.get("dpop", {}))]
    if nonce_rps is not None:
        r.runs[("dpop-nonce", "gatehouse")] = [wrk_run(nonce_rps, cpu=nonce_cpu, **invalid.get("nonce", {}))]
    return r


def test_ratio_of_across_targets():
    r = bound(nonce_rps=700, nonce_cpu=90.0, bearer_cpu=60.0)
    assert ratio_of(r, "dpop-nonce", "gatehouse", "gatehouse", ref_target="sealed-sqlite") == pytest.approx(0.7)
    assert ratio_of(r, "dpop-nonce", "gatehouse", "gatehouse", key="cpu", ref_target="sealed-sqlite") == pytest.approx(1.5)
    assert ratio_of(r, "dpop-nonce", "gatehouse", "sealed-sqlite") is None  # without ref_target: the same target's side


def test_the_store_mode_is_reported_only():
    assert goal("dpop").threshold is None and "store" in goal("dpop").text
    assert judge(goal("dpop"), bound(dpop_rps=300)) == ("0.30×", "reported")
    # an invalid side is still compared, from the medians as they are
    assert judge(goal("dpop"), bound(dpop_rps=500, dpop={"non2xx": 1})) == ("0.50×", "reported")
    assert judge(goal("dpop"), bound(nonce_rps=700)) == ("not measured", "not measured")


def test_instance_nonces_against_the_sealed_bearer_token():
    assert judge(goal("dpop-nonce"), bound(nonce_rps=600)) == ("0.60×", "met")
    assert judge(goal("dpop-nonce"), bound(nonce_rps=599)) == ("0.60×", "**missed**")  # 0.599: below, though shown rounded
    assert judge(goal("dpop-nonce"), bound(nonce_rps=500, nonce={"non2xx": 1})) == ("0.50×", "**missed**")
    assert judge(goal("dpop-nonce"), bound(dpop_rps=900)) == ("not measured", "not measured")


def test_instance_nonces_cpu_per_request():
    assert judge(goal("dpop-nonce-cpu"), bound(nonce_rps=700, nonce_cpu=120.0, bearer_cpu=60.0)) == (
        "2.00× (120.0 / 60.0 µs per request)", "met")
    assert judge(goal("dpop-nonce-cpu"), bound(nonce_rps=700, nonce_cpu=121.0, bearer_cpu=60.0))[1] == "**missed**"
    # the CPU goal needs both sides valid and measured
    assert judge(goal("dpop-nonce-cpu"), bound(nonce_rps=700, nonce_cpu=90.0))[1] == "not measured"
    assert judge(goal("dpop-nonce-cpu"), bound(nonce_rps=700, nonce_cpu=90.0, bearer_cpu=60.0, nonce={"non2xx": 1}))[1] == "not measured"


def test_a_reported_goal_has_no_verdict():
    r = Results()
    r.capacity = [{"concurrency": 16, "rate": 900.0}, {"concurrency": 64, "rate": 1500.0}, {"concurrency": 128, "rate": 1400.0}]
    assert judge(goal("capacity"), r) == ("1,500 refreshes/s (at 64 concurrent)", "reported")


def test_storm_verdict_counts_the_storms_not_as_expected():
    r = Results()
    r.storms = [{"refresh_grants": 1, "expected_refresh_grants": 1, "ok": 1000, "requests": 1000},
                {"refresh_grants": 0, "expected_refresh_grants": 0, "ok": 1000, "requests": 1000}]
    assert judge(goal("storm"), r) == ("2 of 2 storms as expected", "met")
    r.storms.append({"refresh_grants": 2, "expected_refresh_grants": 1, "ok": 1000, "requests": 1000})
    assert judge(goal("storm"), r) == ("2 of 3 storms as expected", "**missed**")


def test_forward_auth_cpu_per_decision_against_the_relay():
    r = Results()
    r.runs[("forward-auth", "nginx-auth")] = [wrk_run(500, cpu_parts={"proxy": 20.0, "gatehouse": 30.0})]
    r.runs[("forward-auth", "gatehouse")] = [wrk_run(800, cpu=40.0)]
    text, verdict = judge(goal("forward-auth-cpu"), r)
    assert verdict == "met" and text.endswith("(the relay row of the same rounds): 0.75×")


def base(p50=10.0, rate=100.0, ok=100, errors=0):
    return {"ok": ok, "errors": errors, "p50": p50, "rate": rate}


def test_token_overhead_sequential():
    row = token_overhead(base(p50=11.0), base(p50=10.0), concurrent=False)
    assert row["overhead_ms"] == pytest.approx(1.0) and row["overhead_pct"] == pytest.approx(10.0)
    assert row["met"] is True and "rate_ratio" not in row
    row = token_overhead(base(p50=13.0), base(p50=10.0), concurrent=False)  # +30 %, +3 ms
    assert row["met"] is False
    row = token_overhead(base(p50=1.4), base(p50=1.0), concurrent=False)  # +40 % but only +0.4 ms
    assert row["met"] is True


def test_token_overhead_concurrent_counts_the_rate_shortfall():
    row = token_overhead(base(p50=10.0, rate=50.0), base(p50=10.0, rate=100.0), concurrent=True)
    assert row["rate_ratio"] == pytest.approx(0.5)
    assert row["overhead_pct"] == pytest.approx(100.0)  # the rate, worse than the median's 0 %
    assert row["met"] is True  # +0 ms: within 0.5 ms


def test_token_overhead_errors_and_empty_sides():
    assert token_overhead(base(p50=10.0, errors=1), base(p50=10.0), concurrent=False)["met"] is False
    assert token_overhead(base(ok=0), base(), concurrent=False) == {}
    assert token_overhead(base(), base(ok=0), concurrent=False) == {}


def test_token_goal_reads_the_rows():
    r = Results()
    assert judge(goal("token-overhead"), r) == ("not measured", "not measured")
    r.token_rows = [{"row": "SQLite, sequential, direct (upstream)"},
                    {"row": "SQLite, sequential, sealed app", "overhead_pct": 5.0, "overhead_ms": 0.1, "met": True},
                    {"row": "SQLite, concurrent, sealed app", "overhead_pct": 35.0, "overhead_ms": 2.0, "met": False}]
    assert judge(goal("token-overhead"), r) == ("worst +35 % / +2.00 ms (SQLite, concurrent, sealed app); 1 of 2 rows over",
                                                "**missed**")


def token_rows(pass_p50=3.0, direct_p50=2.2, errors=0, store="SQLite", mode="sequential"):
    direct = {"row": f"{store}, {mode}, direct (upstream)", "store": store, "mode": mode, "side": "direct (upstream)",
              "ok": 200, "errors": 0, "p50": direct_p50, "p99": 4.0, "rate": 400.0}
    res = {"ok": 200, "errors": errors, "p50": pass_p50, "p99": 5.0, "rate": 300.0}
    row = {"row": f"{store}, {mode}, passthrough app", "store": store, "mode": mode, "side": "passthrough app", **res,
           **token_overhead(res, direct, concurrent=mode == "concurrent")}
    return [direct, row]


def test_token_passthrough_on_sqlite_within_a_millisecond():
    r = Results()
    r.token_rows = token_rows(pass_p50=3.0, direct_p50=2.2)
    assert judge(goal("token-passthrough-sqlite"), r) == ("+0.80 ms (median 3.00 vs 2.20 ms direct)", "met")
    r.token_rows = token_rows(pass_p50=3.3, direct_p50=2.2)
    assert judge(goal("token-passthrough-sqlite"), r) == ("+1.10 ms (median 3.30 vs 2.20 ms direct)", "**missed**")
    r.token_rows = token_rows(pass_p50=2.5, direct_p50=2.2, errors=2)
    assert judge(goal("token-passthrough-sqlite"), r) == ("+0.30 ms (median 2.50 vs 2.20 ms direct); 2 errors", "**missed**")


def test_token_passthrough_reads_only_the_sequential_sqlite_row():
    r = Results()
    r.token_rows = token_rows(store="PostgreSQL") + token_rows(pass_p50=9.0, mode="concurrent")
    assert judge(goal("token-passthrough-sqlite"), r) == ("not measured", "not measured")
    r.token_rows += token_rows(pass_p50=2.0, direct_p50=2.2)
    assert judge(goal("token-passthrough-sqlite"), r) == ("-0.20 ms (median 2.00 vs 2.20 ms direct)", "met")


def test_the_baseline_row_is_not_judged_by_the_token_goal():
    r = Results()
    r.token_rows = token_rows(pass_p50=2.3, direct_p50=2.2)
    r.token_rows.append({"row": "SQLite, sequential, passthrough app, baseline binary", "store": "SQLite", "mode": "sequential",
                         "side": "passthrough app, baseline binary", "overhead_pct": 500.0, "overhead_ms": 9.0, "met": None,
                         "baseline": True})
    assert judge(goal("token-overhead"), r)[1] == "met"


def test_goals_table_has_a_row_per_goal():
    table = goals_table(passthrough(850, 1000)).splitlines()
    assert table[:4] == ["### Goals", "", "| goal | measured | verdict |", "|---|---|---|"]
    assert len(table) == 4 + len(GOALS)
    assert table[5] == "| passthrough GET requests/s ≥ 0.8× nginx proxy_pass (access log on) (`passthrough-nginx`) | 0.85× | met |"
    assert sum("not measured | not measured" in line for line in table) == len(GOALS) - 3
