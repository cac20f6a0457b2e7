"""The failover target (bench.failover): its place among the targets, the test's command line, and
the report's table rendered from the figures the end-to-end test writes."""

import json

import pytest

from bench import failover
from bench.targets import GROUPS, TARGET, select


def phase(lost=0, undone=0, accepted=0, event_s=3.6, unexpected=None, never=False):
    """One phase's figures as Tests/Support/failover.py writes them."""
    return {
        "sessions": 40, "sessions_lost": lost, "revocations": 4, "revocations_undone": undone,
        "replays_checked": 36, "replays_accepted": accepted, "event_s": event_s,
        "recovery": {
            "refresh@0": {"first_success_s": 3.9, "longest_without_success_s": 3.8, "answers_before": {"503": 12}},
            "relay@0": {"first_success_s": 4.25, "longest_without_success_s": 4.25, "answers_before": {}},
            "refresh@1": {"first_success_s": None if never else 6.04, "answers_before": {"0": 2, "503": 30}},
            "relay@1": {"first_success_s": 5.5, "answers_before": {"503": 7, "401": 1}},
        },
        "answers_after_event": {"refresh 200": 41, "refresh 503": 26},
        "unexpected": unexpected or {},
    }


def cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def table_rows(text):
    return [cells(l) for l in text.splitlines() if l.startswith("| ") and not l.startswith("| mode ")]


def test_the_target_is_asked_for_by_name_and_is_not_in_all():
    assert [t.name for t in select("failover")[0]] == ["failover"]
    assert "failover" not in GROUPS["all"]
    assert [t.name for t in select("all,failover")[0]][-2:] == ["capacity", "failover"]
    t = TARGET["failover"]
    assert t.kind == "failover" and t.gatehouse_only and not t.stack and not t.pg
    assert set(t.packages) == {"etcd-server", "haproxy", "postgresql"}
    with pytest.raises(ValueError):
        select("nginx,failover")


def test_the_command_runs_the_end_to_end_test_with_its_own_ini():
    assert failover.command("/v/bin/python") == [
        "/v/bin/python", "-m", "pytest", "Tests/EndToEnd/test_postgres_failover.py", "-q", "-p", "no:cacheprovider",
        "-c", "Tests/EndToEnd/pytest.ini", "--rootdir", "Tests/EndToEnd"]
    assert (failover.ROOT / failover.TEST).is_file()


def test_a_row_per_mode_and_event_with_each_instance_s_recovery():
    figures = {"synchronous": {"switchover": phase(event_s=1.234), "failover": phase(event_s=24.51)},
               "asynchronous": {"switchover": phase(), "failover": phase(lost=1, undone=1, accepted=2, never=True)}}
    text = failover.failover_table(figures)
    assert text.startswith("### PostgreSQL failover (Patroni + etcd + HAProxy, two instances)\n")
    header = next(l for l in text.splitlines() if l.startswith("| mode "))
    separator = text.splitlines()[text.splitlines().index(header) + 1]
    assert len(cells(header)) == len(cells(separator)) == 14
    assert table_rows(text) == [
        ["synchronous", "switchover", "0 / 40", "0 / 4", "0 / 36", "1.2", "3.9", "4.2", "3.8 / 4.2", "503×12 / none",
         "6.0", "5.5", "– / –", "503×30, no answer×2 / 503×7, 401×1"],
        ["synchronous", "failover", "0 / 40", "0 / 4", "0 / 36", "24.5", "3.9", "4.2", "3.8 / 4.2", "503×12 / none",
         "6.0", "5.5", "– / –", "503×30, no answer×2 / 503×7, 401×1"],
        ["asynchronous", "switchover", "0 / 40", "0 / 4", "0 / 36", "3.6", "3.9", "4.2", "3.8 / 4.2", "503×12 / none",
         "6.0", "5.5", "– / –", "503×30, no answer×2 / 503×7, 401×1"],
        ["asynchronous", "failover", "1 / 40", "1 / 4", "2 / 36", "3.6", "3.9", "4.2", "3.8 / 4.2", "503×12 / none",
         "never", "5.5", "– / –", "503×30, no answer×2 / 503×7, 401×1"],
    ]
    assert "leader lock expires (ttl 20 s)" in text and "the SIGKILL of the primary" in text
    assert "the test failed" not in text and "answers that must never be" not in text


def test_a_failed_test_still_shows_its_figures_and_says_it_failed():
    figures = {"synchronous": {"switchover": phase(unexpected={"refresh 500": 3}), "failover": phase()}, "asynchronous": None}
    text = failover.failover_table(figures, "pytest exit 1", ".build/benchmarks/runs/failover.log")
    assert [r[:2] for r in table_rows(text)] == [["synchronous", "switchover"], ["synchronous", "failover"]]
    notes = [l for l in text.splitlines() if l.startswith("- ")]
    assert notes == [
        "- the test failed (pytest exit 1); its output: `.build/benchmarks/runs/failover.log`; the figures above are those it "
        "wrote",
        "- synchronous switchover: answers that must never be: refresh 500×3",
        "- asynchronous: no figures (the test wrote no failover-asynchronous.json: it stopped before the end of that mode)",
    ]


def test_no_file_at_all_gives_the_explanatory_line(tmp_path):
    figures = failover.load_figures(tmp_path)
    assert figures == {"synchronous": None, "asynchronous": None}
    text = failover.failover_table(figures, "pytest exit 2", "log")
    assert "| mode " not in text
    assert "No figures: the test wrote no failover-*.json." in text.splitlines()
    assert "- the test failed (pytest exit 2); its output: `log`" in text.splitlines()


def test_the_files_are_read_per_mode(tmp_path):
    (tmp_path / "failover-synchronous.json").write_text(json.dumps({"switchover": phase(), "failover": phase()}))
    (tmp_path / "failover-asynchronous.json").write_text("{not json")
    figures = failover.load_figures(tmp_path)
    assert figures["synchronous"]["failover"]["sessions"] == 40
    assert figures["asynchronous"].startswith("unreadable failover-asynchronous.json: ")
    text = failover.failover_table(figures)
    assert len(table_rows(text)) == 2 and "- asynchronous: no figures (unreadable failover-asynchronous.json: " in text
    (tmp_path / "failover-asynchronous.json").write_text("[]")
    assert failover.load_figures(tmp_path)["asynchronous"] == "failover-asynchronous.json holds no JSON object"


def test_an_instance_that_did_not_stop_cleanly_is_noted():
    figures = {"synchronous": {"switchover": phase(), "failover": phase(), "exit_statuses": [0, -4]},
               "asynchronous": {"switchover": phase(), "failover": phase(), "exit_statuses": [0, 0]}}
    text = failover.failover_table(figures)
    assert "- synchronous: exit statuses after SIGTERM [0, -4]" in text
    assert "asynchronous: exit statuses" not in text
    assert len(table_rows(text)) == 4
