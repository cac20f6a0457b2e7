"""The report's notes of a side's runs (bench.tables.run_notes): both tables write them this way;
the bound tokens' table and the token table's baseline line."""

from bench.stats import Results
from bench.tables import bound_table, run_notes, token_baseline_line
from conftest import wrk_run


def test_each_invalid_run_and_socket_line_becomes_a_note_under_its_side():
    side = {"invalid": [(2, ["non-2xx answers 3", "body unchecked"])], "socket": ["socket errors: connect 1"]}
    assert run_notes("relay, gatehouse", side) == [
        "- relay, gatehouse, run 2: INVALID: non-2xx answers 3; body unchecked",
        "- relay, gatehouse, socket errors: connect 1",
    ]


def test_a_clean_side_has_no_notes():
    assert run_notes("relay", {"invalid": [], "socket": None}) == []
    assert run_notes("relay", {"invalid": []}) == []


def bound_rows(table):
    return {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in table.splitlines() if line.startswith("| ")
            and not line.startswith("| row ")}


def test_the_bound_table_puts_both_dpop_modes_next_to_the_bearer_token():
    r = Results()
    assert bound_table(r) == ""  # no DPoP target ran
    r.runs[("sealed-sqlite", "gatehouse")] = [wrk_run(1000, p50=0.5, cpu=50.0)]
    r.runs[("dpop", "gatehouse")] = [wrk_run(300, p50=1.5, cpu=160.0)]
    r.runs[("dpop-nonce", "gatehouse")] = [wrk_run(550, p50=0.9, cpu=95.0)]
    rows = bound_rows(bound_table(r))
    assert list(rows) == ["sealed bearer token (`gha_`)", "DPoP-bound (`ghd_`), store", "DPoP-bound (`ghd_`), instance nonces"]
    bearer, store, nonce = rows.values()
    assert bearer[2:8] == ["1,000", "-", "50.0", "-", "0.500", "2.000"] and bearer[-1] == "reference |"
    assert store[2:6] == ["300", "0.30×", "160.0", "3.20×"] and store[-2:] == ["reported", "reported |"]
    assert nonce[2:7] == ["550", "0.55×", "95.0", "1.90×", "0.900"]
    assert nonce[-2] == "≥ 0.6× req/s; ≤ 2× CPU"
    assert nonce[-1] == "missed (0.55×); met |"


def test_the_bound_table_names_a_skipped_row():
    r = Results()
    r.runs[("sealed-sqlite", "gatehouse")] = [wrk_run(1000, cpu=50.0)]
    r.failed[("dpop-nonce", "gatehouse")] = "skipped: this binary refuses the configuration (dpop.replay_protection: unknown key)"
    table = bound_table(r)
    nonce = bound_rows(table)["DPoP-bound (`ghd_`), instance nonces"]
    assert nonce[2] == "skipped" and nonce[-1] == "skipped |"
    assert "- DPoP-bound (`ghd_`), instance nonces: skipped (this binary refuses the configuration" in table
    assert "DPoP-bound (`ghd_`), store" not in table  # not run, not failed: no row


def test_token_baseline_line():
    cur = {"store": "SQLite", "mode": "sequential", "side": "passthrough app", "p50": 2.5, "p99": 4.0}
    base = {"store": "SQLite", "mode": "sequential", "side": "passthrough app, baseline binary", "p50": 2.0, "p99": 3.5, "baseline": True}
    assert token_baseline_line([cur]) is None
    assert token_baseline_line([cur, base]) == ("- current vs baseline binary (passthrough refresh, sequential, SQLite): "
                                                "median 2.500 vs 2.000 ms (+0.500 ms), p99 4.000 vs 3.500 ms")
    assert token_baseline_line([dict(cur, p50=None), base]).endswith("n/a (a row refreshed nothing)")
