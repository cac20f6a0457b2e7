"""The measured runs: `run_target` alternates a target's rows ROUNDS times after a warm-up,
`measure` is one wrk run with CPU, context switches and RSS read around it from /proc, and
`profile_report` the perf profile of a target's last Gatehouse round (PROFILE=target) or, when
one of the target's `profile_goals` is missed, of an extra run after its rounds (`profile_on_miss`)."""

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from .goals import GOALS, judge
from .paths import CHECK_LUA, OUT_DIR, PERF_BUCKETS_PY, RUNS_DIR
from .proc import CLK_TCK, count_lines, cpu_delta, cpu_snapshot, cpu_ticks, switches_snapshot, vm_kib
from .processes import log_tail, pause, say, warn
from .stats import fmt_ms, problems_of
from .wrk import parse_wrk


def refresh_count(url):
    """The refresh grants the counting token proxy has passed on so far (its /_counts), or None."""
    if not url:
        return None
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return int(json.load(response).get("refresh_token", 0))
    except (OSError, ValueError):
        return None


def measure(ctx, target, side, round_, url, request, cpu_pids, rss_pid=None, instance=None, header=None,
            proofs=None, counts_url=None, seconds=None, cpu_tree=True, cpu_parts=None, record=True):
    """One wrk run. cpu_parts: {name: (pids, tree)}: parts of the side whose CPU µs per request
    are also recorded apart (run["cpu_parts"]), e.g. a forward-auth front's proxy and Gatehouse.
    record: False for a run that does not count (the extra run under perf; round_ names it)."""
    seconds = seconds or ctx.duration
    base = RUNS_DIR / ("warmup" if round_ == 0 else "") / (f"{target.name}.{side}" + ("" if round_ == 0 else f".{round_}"))
    cmd = ["wrk", f"-t{ctx.threads}", f"-c{ctx.connections}", f"-d{seconds}s", "--latency", "-s", str(CHECK_LUA)]
    if header:
        cmd += ["-H", header]
    cmd.append(url)
    shown = " ".join(shlex.quote(ctx.rel(a)) for a in cmd).replace(ctx.token, "<token>")
    if ctx.shown_token:
        shown = shown.replace(ctx.shown_token, f"<{ctx.shown_token[:4]} token>")
    if round_ and record and f"{target.name}/{side}" not in ctx.results.wrk_shown:
        ctx.results.wrk_shown[f"{target.name}/{side}"] = shown
    which = "warm-up" if round_ == 0 else f"run {round_} of {ctx.rounds}" if record else f"{round_} run (not counted)"
    say(f"{target.name}, {side}, {which}: {shown}")
    env = dict(os.environ, BENCH_EXPECT_FILE=str(request["expect"]), BENCH_CHECK_EVERY="1000")
    if request.get("method"):
        env["BENCH_METHOD"] = request["method"]
    if request.get("body"):
        env["BENCH_BODY_FILE"] = str(request["body"])
        env["BENCH_CONTENT_TYPE"] = "application/json"
    if proofs:
        env["BENCH_PROOFS_FILE"] = str(proofs)
        env["BENCH_PROOF_THREADS"] = str(ctx.threads)
    identity_before = count_lines(ctx.identity_log)
    refresh_before = refresh_count(counts_url)
    before = cpu_snapshot(cpu_pids, cpu_tree)
    parts_before = {name: cpu_snapshot(pids, tree) for name, (pids, tree) in (cpu_parts or {}).items()}
    switches_before = switches_snapshot(cpu_pids, cpu_tree)
    rss_max = None
    started = time.monotonic()
    with open(f"{base}.txt", "wb") as out:
        child = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            while child.poll() is None:
                if rss_pid:
                    current, _ = vm_kib(rss_pid)
                    if current is not None:
                        rss_max = current if rss_max is None else max(rss_max, current)
                if time.monotonic() - started > seconds + 60:
                    child.kill()
                    break
                time.sleep(0.2)
        finally:
            if child.poll() is None:
                child.kill()
            rc = child.wait()
    elapsed = time.monotonic() - started
    after = cpu_snapshot(cpu_pids, cpu_tree)
    parts_after = {name: cpu_snapshot(pids, tree) for name, (pids, tree) in (cpu_parts or {}).items()}
    switches_after = switches_snapshot(cpu_pids, cpu_tree)
    text = Path(f"{base}.txt").read_text(errors="replace")
    run = {"target": target.name, "side": side, "round": round_, "instance": instance, "wrk_rc": rc,
           "elapsed_s": round(elapsed, 3), "pids": sorted(after), "error": None}
    try:
        run.update(parse_wrk(text))
    except ValueError as error:
        run["error"] = f"wrk: {error}"
    if rc != 0 and not run["error"]:
        run["error"] = f"wrk exited with status {rc}"
    if cpu_pids and all(cpu_ticks(p) is not None for p in cpu_pids):
        run["cpu_ticks"] = cpu_delta(before, after)
        run["clk_tck"] = CLK_TCK
        if run.get("requests"):
            run["cpu_us_per_req"] = run["cpu_ticks"] / CLK_TCK * 1e6 / run["requests"]
            run["switches_per_req"] = cpu_delta(switches_before, switches_after) / run["requests"]
            if cpu_parts:
                run["cpu_parts"] = {name: cpu_delta(parts_before[name], parts_after[name]) / CLK_TCK * 1e6 / run["requests"]
                                    for name in cpu_parts}
    elif cpu_pids:
        run["cpu_note"] = "a measured process exited during the run"
    if rss_pid:
        run["rss_max_kib"] = rss_max
        run["hwm_kib"] = vm_kib(rss_pid)[1]
    if instance:
        run["identity_calls"] = count_lines(ctx.identity_log) - identity_before
    if counts_url:
        after_counts = refresh_count(counts_url)
        run["refresh_grants"] = None if refresh_before is None or after_counts is None else after_counts - refresh_before
    Path(f"{base}.json").write_text(json.dumps(run, indent=1))
    for line in text.rstrip().splitlines():
        print("    " + line, file=sys.stderr)
    summary = "; ".join(problems_of(run)) or "valid"
    if run.get("rps") is not None:
        cpu = f", CPU {run['cpu_us_per_req']:.1f} µs/request" if run.get("cpu_us_per_req") is not None else ""
        if run.get("cpu_parts"):
            cpu += " (" + ", ".join(f"{name} {value:.1f}" for name, value in run["cpu_parts"].items()) + ")"
        print(f"    -> {run['rps']:,.0f} requests/s, p50 {fmt_ms(run['p50'])} ms, p99 {fmt_ms(run['p99'])} ms{cpu}; {summary}",
              file=sys.stderr)
    else:
        print(f"    -> {summary}", file=sys.stderr)
    if round_ and record:
        ctx.results.runs.setdefault((target.name, side), []).append(run)
    return run


def run_target(ctx, target, sides):
    """The interleaved rounds of a wrk target. sides: dicts with name, url, cpu (pids), and for
    Gatehouse rows proc, instance, header, proofs (per round), counts; in their order in a round."""
    request = {"expect": target.expect, "method": target.method, "body": target.body}
    live = [s for s in sides if not s.get("failed")]
    for s in sides:
        if s.get("failed"):
            ctx.results.failed[(target.name, s["name"])] = s["failed"]
    rounds, warmup = ctx.rounds, ctx.warmup
    if not ctx.nginx_only and not any(s.get("proc") for s in live):
        rounds, warmup = 1, 0  # nothing of Gatehouse to compare with: the references once, for the record
    say(f"target {target.name}: {rounds} round(s) of {ctx.duration} s ({', '.join(s['name'] for s in live)})")

    def one(s, round_, seconds=None, record=True):
        proofs = s.get("proofs")  # a DPoP target's: run name -> its file of proofs (stack.ProofFiles)
        return measure(ctx, target, s["name"], round_, s["url"], request, s["cpu"], rss_pid=s.get("rss"),
                       instance=s.get("instance"), header=s.get("header"),
                       proofs=proofs("warmup" if round_ == 0 else str(round_)) if proofs else None,
                       counts_url=s.get("counts"), seconds=seconds, cpu_tree=s.get("cpu_tree", True),
                       cpu_parts=s.get("cpu_parts"), record=record)

    if warmup:
        for s in live:
            one(s, 0, warmup)
        pause(ctx.pause_s)
    for round_ in range(1, rounds + 1):
        for i, s in enumerate(list(live)):
            if s.get("proc") is not None and s["proc"].poll() is not None:
                continue
            if i:
                pause(ctx.pause_s)
            perf = None
            if s["name"] == "gatehouse" and ctx.profile == target.name and round_ == rounds:
                perf = start_perf(ctx, target, s)
            run = one(s, round_)
            if perf:
                wait_perf(target, perf)
                profile_report(ctx, target, run)
            if s.get("proc") is not None and s["proc"].poll() is not None:
                warn(f"{s['name']} exited during the load run; last 30 lines of its log:")
                log_tail(ctx.run_dir / f"gatehouse-{s['instance']}.log")
                ctx.results.failed[(target.name, s["name"])] = f"exited during run {round_}"
        if round_ < rounds:
            pause(ctx.pause_s)
    if not ctx.nginx_only and ctx.profile != target.name:
        profile_on_miss(ctx, target, live, one)


def missed_goals(target, results):
    """The ids of the target's `profile_goals` that the results miss (judged as the goals table does)."""
    return [g.id for g in GOALS if g.id in target.profile_goals and judge(g, results)[1] == "**missed**"]


def start_perf(ctx, target, s):
    """`perf record -g` on a Gatehouse side's process for DURATION seconds (its recording in OUT_DIR)."""
    return subprocess.Popen(["perf", "record", "-F", str(ctx.profile_hz), "-g", "-p", str(s["proc"].pid),
                             "-o", str(OUT_DIR / f"perf-{target.name}.data"), "--", "sleep", str(ctx.duration)],
                            stdout=open(OUT_DIR / f"perf-{target.name}.log", "wb"), stderr=subprocess.STDOUT)


def wait_perf(target, perf):
    """Waits for `start_perf`'s recording to end; a warning when it failed."""
    if perf.wait() != 0:
        warn(f"perf record exited with status {perf.returncode} (see {OUT_DIR / f'perf-{target.name}.log'})")


def profile_on_miss(ctx, target, live, one):
    """When the target's rounds miss one of its `profile_goals`: one extra run of its Gatehouse row
    under perf, after the rounds and not counted, profiled into the report (or a note why not)."""
    missed = missed_goals(target, ctx.results)
    if not missed:
        return
    s = next((x for x in live if x["name"] == "gatehouse" and x.get("proc") is not None and x["proc"].poll() is None), None)
    if s is None:
        return
    if not shutil.which("perf"):
        ctx.results.notes.append(f"{target.label}: {', '.join(missed)} missed; no profile (perf is not installed)")
        return
    say(f"{target.name}: {', '.join(missed)} missed: one more run, under perf, not counted")
    if s.get("proofs") and not s["proofs"]("profile"):
        ctx.results.notes.append(f"{target.label}: {', '.join(missed)} missed; no profile ({s['proofs'].problem})")
        return
    pause(ctx.pause_s)
    perf = start_perf(ctx, target, s)
    run = one(s, "profile", record=False)
    wait_perf(target, perf)
    if run.get("rps") is None or problems_of(run):
        ctx.results.notes.append(f"{target.label}: the extra run under perf after {', '.join(missed)} was missed was not valid: "
                                 + ("; ".join(problems_of(run)) or "no numbers"))
    profile_report(ctx, target, run, how=f"an extra run after its rounds, not counted: {', '.join(missed)} missed")


def profile_report(ctx, target, run, how="its last Gatehouse round, under perf"):
    """The perf profile of a target's Gatehouse run (its last round, or `how` it was recorded),
    bucketed by perf_buckets.py, for the report."""
    requests = run.get("requests")
    cpu_us = run["cpu_ticks"] / CLK_TCK * 1e6 if run.get("cpu_ticks") else None
    script = subprocess.run(["perf", "script", "-i", str(OUT_DIR / f"perf-{target.name}.data"), "-F", "comm,tid,ip,sym,dso"],
                            capture_output=True)
    argv = [sys.executable, str(PERF_BUCKETS_PY)]
    if requests:
        argv += ["--requests", str(requests)]
    if cpu_us:
        argv += ["--cpu-us", str(cpu_us)]
    out = subprocess.run(argv, input=script.stdout, capture_output=True)
    (OUT_DIR / f"profile-{target.name}.md").write_bytes(out.stdout)
    if out.returncode:
        warn(f"perf_buckets.py failed for {target.name}")
    say(f"profile of {target.name} ({how}; under perf, its figures are lower than the others):")
    sys.stderr.write(out.stdout.decode(errors="replace"))
    ctx.results.profile[target.name] = out.stdout.decode(errors="replace")
    ctx.results.profile_how[target.name] = how
