"""The token target's sequential slices and their merge (bench.refresh), the DPoP targets' proof
files (bench.stack.ProofFiles, sealed.py replaced by a recorder) and which missed goals get a
profile (bench.rounds.missed_goals)."""

import types

import pytest

from bench import rounds, stack
from bench.refresh import merge_loads, slices
from bench.stats import Results
from bench.targets import TARGET
from conftest import wrk_run


def test_slices_cut_a_count_as_evenly_as_can_be():
    assert slices(200) == [50, 50, 50, 50]
    assert slices(30) == [8, 8, 7, 7]
    assert slices(3) == [1, 1, 1]  # never an empty slice
    assert slices(7, parts=1) == [7]
    assert sum(slices(1001)) == 1001


def load(samples, wall, errors=0, first_error=None):
    return {"ok": len(samples), "errors": errors, "first_error": first_error, "wall": wall, "samples": sorted(samples)}


def test_merge_loads_takes_the_percentiles_over_every_latency():
    merged = merge_loads([load([1.0, 2.0, 9.0], 0.5), load([3.0, 4.0], 0.5, errors=1, first_error="status 400")])
    assert merged["ok"] == 5 and merged["errors"] == 1 and merged["first_error"] == "status 400"
    assert merged["p50"] == 3.0  # the median of 1, 2, 3, 4, 9, not a median of the slices' medians (2 and 3.5)
    assert merged["p99"] == 9.0
    assert merged["rate"] == pytest.approx(5.0)  # 5 refreshes over 1 s of the slices' own time
    assert merged["samples"] == [1.0, 2.0, 3.0, 4.0, 9.0]


def test_merge_loads_of_nothing():
    merged = merge_loads([load([], 0.1, errors=1, first_error="OSError"), load([], 0.0)])
    assert (merged["ok"], merged["p50"], merged["p99"], merged["first_error"]) == (0, None, None, "OSError")


def proof_files(monkeypatch, tmp_path, nonces):
    """A ProofFiles whose sealed.py calls are recorded (each answers as `rc`), with nonces from a list."""
    calls = []

    def run(argv, **_):
        calls.append(argv)
        return types.SimpleNamespace(returncode=0)

    monkeypatch.setattr(stack.subprocess, "run", run)
    ctx = types.SimpleNamespace(venv_py="python", warmup=1, duration=10, dpop_rate=100)
    given = iter(nonces) if nonces is not None else None
    files = stack.ProofFiles(ctx, tmp_path / "key.pem", "ghd_token", "http://127.0.0.1:1/api/data", tmp_path / "p",
                             (lambda: next(given)) if given else None)
    return files, calls


def arg(argv, name):
    return argv[argv.index(name) + 1] if name in argv else None


def test_proof_files_never_overlap_and_each_takes_a_current_nonce(monkeypatch, tmp_path):
    files, calls = proof_files(monkeypatch, tmp_path, [("n1", ""), ("n2", ""), ("n3", "")])
    assert files("warmup") == f"{tmp_path}/p-warmup"
    assert files("1") == f"{tmp_path}/p-1"
    assert files("1") == f"{tmp_path}/p-1" and len(calls) == 2  # made once
    assert files("profile") == f"{tmp_path}/p-profile"
    assert [(arg(c, "--count"), arg(c, "--first"), arg(c, "--nonce")) for c in calls] == [
        ("300", "0", "n1"), ("1200", "300", "n2"), ("1200", "1500", "n3")]  # (run s + 2) × DPOP_RATE; jti from where the last ended


def test_proof_files_without_nonces_and_when_the_nonce_is_refused(monkeypatch, tmp_path):
    files, calls = proof_files(monkeypatch, tmp_path, None)
    files("1")
    assert arg(calls[0], "--nonce") is None
    files, calls = proof_files(monkeypatch, tmp_path, [("", "no DPoP-Nonce")])
    assert files("1") is None and files.problem == "no DPoP-Nonce" and calls == []


def test_a_missed_goal_of_the_nonce_target_asks_for_its_profile():
    t = TARGET["dpop-nonce"]
    r = Results()
    r.runs[("sealed-sqlite", "gatehouse")] = [wrk_run(1000, cpu=50.0)]
    r.runs[("dpop-nonce", "gatehouse")] = [wrk_run(700, cpu=90.0)]
    assert rounds.missed_goals(t, r) == []
    r = Results()
    r.runs[("sealed-sqlite", "gatehouse")] = [wrk_run(1000, cpu=50.0)]
    r.runs[("dpop-nonce", "gatehouse")] = [wrk_run(500, cpu=110.0)]
    assert rounds.missed_goals(t, r) == ["dpop-nonce", "dpop-nonce-cpu"]
    assert rounds.missed_goals(TARGET["dpop"], r) == []  # no profile_goals: the store mode is reported only
