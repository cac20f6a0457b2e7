"""The medians, spreads, percentiles and validity of runs (bench.stats)."""

import pytest

from bench.stats import Results, fmt_ms, median_or_none, mib, percentile, problems_of, spread_text, summarize
from conftest import wrk_run


def test_summarize_takes_medians_over_the_runs():
    s = summarize([wrk_run(900, p50=1.0, p99=5.0, cpu=30.0, round_=1), wrk_run(1000, p50=2.0, p99=4.0, cpu=20.0, round_=2),
                   wrk_run(1100, p50=3.0, p99=9.0, cpu=25.0, round_=3)])
    assert s["valid"] and s["runs"] == s["measured"] == 3
    assert (s["rps"], s["p50"], s["p99"], s["cpu"]) == (1000, 2.0, 5.0, 25.0)
    assert s["spread"] == pytest.approx(0.2)  # (1100 - 900) / 1000
    assert s["all_rps"] == [900, 1000, 1100]
    assert s["checked"] == 30


def test_summarize_of_nothing_and_of_runs_without_numbers():
    assert summarize(None) is None and summarize([]) is None
    s = summarize([{"round": 1, "error": "wrk: unable to connect"}])
    assert s == {"runs": 1, "valid": False, "invalid": [(1, ["wrk: unable to connect"])]}


def test_one_invalid_run_makes_the_side_invalid_but_keeps_its_numbers():
    bad = wrk_run(500, round_=2, non2xx=3)
    s = summarize([wrk_run(1000, round_=1), bad])
    assert not s["valid"]
    assert s["invalid"] == [(2, ["3 of 5000 responses not 2xx/3xx"])]
    assert s["rps"] == 750


def test_summarize_adds_the_counters_and_keeps_the_socket_errors():
    s = summarize([wrk_run(1000, identity_calls=2, refresh_grants=1, socket_errors=1, socket_detail="Socket errors: read 1"),
                   wrk_run(1000, round_=2, identity_calls=0, refresh_grants=0)])
    assert (s["identity_calls"], s["refresh_grants"]) == (2, 1)
    assert s["socket"] == ["run 1: Socket errors: read 1"]
    assert summarize([wrk_run(1000)])["identity_calls"] is None


@pytest.mark.parametrize("changes, problems", [
    ({}, []),
    ({"error": "wrk exited with status 1"}, ["wrk exited with status 1"]),
    ({"checked": None}, ["no body-check line (check.lua did not run)"]),
    ({"checked": 0}, ["body check: no response checked"]),
    ({"check_failed": 2, "first_failure": "status 500"}, ["body check: 2 of 10 checked responses wrong (first: status 500)"]),
])
def test_problems_of(changes, problems):
    assert problems_of(wrk_run(100, **changes)) == problems


def test_percentile_is_nearest_rank():
    values = list(range(1, 101))  # 1..100
    assert percentile(values, 99) == 99
    assert percentile(values, 50) == 50
    assert percentile(values, 100) == 100
    assert percentile([7.0], 99) == 7.0
    assert percentile(list(range(1, 11)), 99) == 10  # rank 9.9 rounds up
    assert percentile([], 99) is None


def test_median_or_none():
    assert median_or_none([3, 1, 2]) == 2
    assert median_or_none([1, 2]) == 1.5
    assert median_or_none([]) is None


def test_formats():
    assert (fmt_ms(1.23456), fmt_ms(12.345), fmt_ms(123.45)) == ("1.235", "12.35", "123.5")
    assert mib(2048) == "2.0 MiB" and mib(None) == "n/a"
    assert spread_text(None) == "-"
    assert spread_text(summarize([wrk_run(1000)])) == "n/a (1 run)"
    assert spread_text(summarize([wrk_run(1000), wrk_run(1050, round_=2)])) == "4.9 %"
    assert spread_text(summarize([wrk_run(1000), wrk_run(1200, round_=2)])) == "**18.2 % > 10 %**"


def test_results_side_and_part():
    r = Results()
    r.runs[("forward-auth", "nginx-auth")] = [wrk_run(1000, cpu_parts={"proxy": 10.0, "gatehouse": 30.0}),
                                              wrk_run(1000, round_=2, cpu_parts={"proxy": 20.0, "gatehouse": 50.0})]
    assert r.side("forward-auth", "nginx-auth")["rps"] == 1000
    assert r.part("forward-auth", "nginx-auth", "gatehouse") == 40.0
    assert r.part("forward-auth", "nginx-auth", "missing") is None
    assert r.side("forward-auth", "nobody") is None and r.part("forward-auth", "nobody", "proxy") is None
