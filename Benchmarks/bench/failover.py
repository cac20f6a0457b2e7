"""The failover target: two Gatehouse instances through a real PostgreSQL switchover and failover
(Patroni with etcd and HAProxy), measured by the end-to-end test that already plays the scenario
(Tests/EndToEnd/test_postgres_failover.py), run here with the harness's binary. The test writes
its figures to FAILOVER_FIGURES/failover-MODE.json; `failover_table` renders them (a pure function
of those dicts, whatever the test's verdict was)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from .paths import ROOT, RUNS_DIR
from .processes import say, warn

TEST = "Tests/EndToEnd/test_postgres_failover.py"
MODES = ("synchronous", "asynchronous")
EVENTS = ("switchover", "failover")
INSTANCES = (("0", "HAProxy"), ("1", "`store.postgres.hosts`"))
LEADER_TTL_S = 20                  # Patroni's leader lock (Tests/Support/pgha.py): a killed primary is replaced once it expires
TIMEOUT_S = 900                    # the whole test (both modes); it takes about 2 to 3 minutes
TITLE = "### PostgreSQL failover (Patroni + etcd + HAProxy, two instances)"


def command(python):
    """The test's command line, run from the repository."""
    return [python, "-m", "pytest", TEST, "-q", "-p", "no:cacheprovider", "-c", "Tests/EndToEnd/pytest.ini",
            "--rootdir", "Tests/EndToEnd"]


def load_figures(folder):
    """mode -> the test's figures for it ({"switchover": F, "failover": F}), None when it wrote none,
    or a string saying why the file could not be read."""
    figures = {}
    for mode in MODES:
        path = Path(folder) / f"failover-{mode}.json"
        try:
            figures[mode] = json.loads(path.read_text())
            if not isinstance(figures[mode], dict):
                figures[mode] = f"{path.name} holds no JSON object"
        except FileNotFoundError:
            figures[mode] = None
        except (OSError, ValueError) as error:
            figures[mode] = f"unreadable {path.name}: {error}"
    return figures


def seconds(value):
    return "never" if value is None else f"{value:.1f}"


def answers(counts):
    """Answers by status, compact: `503×12, no answer×2` ("none" when there were none)."""
    if not counts:
        return "none"
    def key(item):
        return (item[0] == "0", -item[1], item[0])
    return ", ".join(f"{'no answer' if status == '0' else status}×{n}" for status, n in sorted(counts.items(), key=key))


def longest(entry):
    """The longest time without a 200 from the event on ("–" when the figures do not have it)."""
    return "–" if "longest_without_success_s" not in entry else seconds(entry["longest_without_success_s"])


def row(mode, event, f):
    """One table row of a phase's figures."""
    cells = [mode, event, f"{f['sessions_lost']} / {f['sessions']}", f"{f['revocations_undone']} / {f['revocations']}",
             f"{f['replays_accepted']} / {f['replays_checked']}", f"{f['event_s']:.1f}"]
    recovery = f.get("recovery", {})
    for instance, _ in INSTANCES:
        refresh, relay = recovery.get(f"refresh@{instance}", {}), recovery.get(f"relay@{instance}", {})
        cells += [seconds(refresh.get("first_success_s")), seconds(relay.get("first_success_s")),
                  f"{longest(refresh)} / {longest(relay)}",
                  f"{answers(refresh.get('answers_before'))} / {answers(relay.get('answers_before'))}"]
    return "| " + " | ".join(cells) + " |"


def failover_table(figures, failed="", log=""):
    """The report's section: `figures` as load_figures gives it; `failed`: how the test failed ("" when
    it passed: "pytest exit 1", …); `log`: its output's path as the report shows it."""
    out = [TITLE, ""]
    rows, notes = [], []
    for mode in MODES:
        mode_figures = figures.get(mode)
        if mode_figures is None:
            notes.append(f"- {mode}: no figures (the test wrote no failover-{mode}.json: it stopped before the end of that mode)")
            continue
        if isinstance(mode_figures, str):
            notes.append(f"- {mode}: no figures ({mode_figures})")
            continue
        statuses = mode_figures.get("exit_statuses")
        if statuses and any(status != 0 for status in statuses):
            notes.append(f"- {mode}: exit statuses after SIGTERM {statuses} (None: still running 40 s later)")
        for event in EVENTS:
            f = mode_figures.get(event)
            if not f:
                notes.append(f"- {mode} {event}: no figures")
                continue
            rows.append(row(mode, event, f))
            if f.get("unexpected"):
                notes.append(f"- {mode} {event}: answers that must never be: {answers(f['unexpected'])}")
    header = ["mode", "event", "sessions lost", "sign-outs undone", "replays accepted", "event (s)"]
    for instance, via in INSTANCES:
        header += [f"#{instance} first refresh 200 (s)", f"#{instance} first relayed 200 (s)",
                   f"#{instance} longest without a 200 (refresh / relay, s)", f"#{instance} error answers before (refresh / relay)"]
    if rows:
        out += ["| " + " | ".join(header) + " |", "|---|---|" + "---:|" * 4 + "---:|---:|---:|---|" * len(INSTANCES), *rows, ""]
        out.append("Each phase has its own sealed sessions refreshing and calling through both instances while Patroni moves the "
                   "primary; sessions lost: their latest refresh token refused afterwards; sign-outs undone: a sign-out answered 200 "
                   "that no longer holds; replays accepted: a spent refresh token exchanged again. Instance #0 reaches PostgreSQL "
                   "through HAProxy, #1 through `store.postgres.hosts` (both servers, no proxy). The times are seconds from the "
                   "event's start (the switchover request, or the SIGKILL of the primary's Patroni and PostgreSQL) to the first "
                   "answer 200 of a request sent after it; the longest without a 200 counts every answer from the event on; event (s): until the switchover was done, or a new primary in place. A "
                   f"killed primary is replaced only once Patroni's leader lock expires (ttl {LEADER_TTL_S} s); a switchover hands the "
                   "lock over without that wait. The error answers are "
                   "those before that first 200 (by status; no answer: a timeout or a refused connection); synchronous mode must "
                   "lose nothing.")
        out.append("")
    else:
        out += ["No figures: the test wrote no failover-*.json.", ""]
    if failed:
        notes.insert(0, f"- the test failed ({failed})" + (f"; its output: `{log}`" if log else "")
                     + ("; the figures above are those it wrote" if rows else ""))
    if notes:
        out += notes + [""]
    return "\n".join(out)


def failover_target(ctx):
    """Runs the end-to-end test with the harness's binary; its figures and verdict for the report."""
    r = ctx.results
    if ctx.binary_problem:
        r.failover = {"figures": {}, "failed": "", "log": "", "problem": ctx.binary_problem}
        return
    say("preparing the Python venv (scripts/python-env)")
    venv = subprocess.run([str(ROOT / "scripts/python-env")], stdout=subprocess.PIPE, text=True)
    if venv.returncode:
        r.failover = {"figures": {}, "failed": "", "log": "", "problem": "scripts/python-env failed"}
        return
    python = str(Path(venv.stdout.strip().splitlines()[-1]) / "bin/python")
    folder = ctx.run_dir / "failover-figures"
    log = RUNS_DIR / "failover.log"
    env = dict(os.environ, GATEHOUSE_BIN=str(ctx.bin), FAILOVER_FIGURES=str(folder))
    say(f"failover: GATEHOUSE_BIN={ctx.rel(ctx.bin)} FAILOVER_FIGURES={folder} {' '.join(command('.venv/bin/python'))} "
        f"(about 2 to 3 minutes; output in {ctx.rel(log)})")
    started = time.monotonic()
    with open(log, "w") as out:
        # Its own process group: the stack it starts (etcd, Patroni, PostgreSQL, HAProxy) goes with it.
        p = ctx.children.spawn(command(python), cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                               start_new_session=True)
        try:
            returncode = p.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            warn(f"failover: the test still runs after {TIMEOUT_S} s: interrupted")
            returncode = None
        finally:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)  # pytest tears its fixtures (the stack) down on an interrupt
                try:
                    p.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    pass
            try:
                os.killpg(p.pid, signal.SIGKILL)  # whatever of the stack is left
            except OSError:
                pass
            p.wait()
            ctx.children.stop(p)
    say(f"failover: pytest exit {returncode} after {time.monotonic() - started:.0f} s")
    if returncode != 0:
        print(Path(log).read_text(errors="replace")[-3000:], file=sys.stderr)
    for path in folder.glob("failover-*.json"):  # kept with the run's other numbers (the temp dir is removed)
        (RUNS_DIR / path.name).write_bytes(path.read_bytes())
    failed = "" if returncode == 0 else f"interrupted after {TIMEOUT_S} s" if returncode is None else f"pytest exit {returncode}"
    r.failover = {"figures": load_figures(folder), "failed": failed, "log": ctx.rel(log), "problem": ""}


def section(ctx):
    """The report's section from what failover_target recorded."""
    f = ctx.results.failover
    if f is None:
        return ""
    if f["problem"]:
        return f"{TITLE}\n\nNot run: {f['problem']}.\n"
    return failover_table(f["figures"], f["failed"], f["log"])
