"""The arithmetic of the report: why a run does not count (`problems_of`), the medians of one
side's runs (`summarize`), a percentile of latencies, the number formats, and Results, the store
of every run and failure that the report and the goals read."""

import statistics


def median_or_none(values):
    """The median of some numbers, or None when there are none."""
    values = list(values)
    return statistics.median(values) if values else None


def percentile(sorted_values, pct):
    """The nearest-rank percentile (`pct` of 100) of values sorted ascending, or None when empty: the
    smallest value with at least pct % of the values at or below it."""
    if not sorted_values:
        return None
    rank = int(len(sorted_values) * pct / 100 + 0.999999)
    return sorted_values[min(len(sorted_values) - 1, max(0, rank - 1))]


def fmt_ms(value):
    """Milliseconds with three significant-ish decimals."""
    return f"{value:.3f}" if value < 10 else f"{value:.2f}" if value < 100 else f"{value:.1f}"


def problems_of(run):
    """Why a run's numbers do not count (empty: they do)."""
    if run.get("error"):
        return [run["error"]]
    found = []
    if run.get("checked") is None:
        found.append("no body-check line (check.lua did not run)")
    elif run["checked"] == 0:
        found.append("body check: no response checked")
    elif run["check_failed"]:
        found.append(f"body check: {run['check_failed']} of {run['checked']} checked responses wrong"
                     + (f" (first: {run['first_failure']})" if run.get("first_failure") else ""))
    if run.get("non2xx"):
        found.append(f"{run['non2xx']} of {run['requests']} responses not 2xx/3xx")
    return found


SPREAD_FLAG = 0.10


def summarize(runs):
    """Medians over the valid runs of one side, or None; with the problems of the invalid ones."""
    if not runs:
        return None
    invalid = [(r["round"], problems_of(r)) for r in runs if problems_of(r)]
    numbers = [r for r in runs if r.get("rps") is not None]
    if not numbers:
        return {"runs": len(runs), "valid": False, "invalid": invalid}
    rps = [r["rps"] for r in numbers]
    median_rps = statistics.median(rps)
    cpu = [r["cpu_us_per_req"] for r in numbers if r.get("cpu_us_per_req") is not None]
    return {
        "runs": len(runs),
        "measured": len(numbers),
        "valid": not invalid,
        "invalid": invalid,
        "rps": median_rps,
        "all_rps": rps,
        "spread": (max(rps) - min(rps)) / median_rps if median_rps else 0.0,
        "p50": statistics.median(r["p50"] for r in numbers),
        "p99": statistics.median(r["p99"] for r in numbers),
        "cpu": statistics.median(cpu) if cpu else None,
        "switches": (statistics.median(r["switches_per_req"] for r in numbers if r.get("switches_per_req") is not None)
                     if any(r.get("switches_per_req") is not None for r in numbers) else None),
        "socket": [f"run {r['round']}: {r['socket_detail']}" for r in numbers if r.get("socket_errors")],
        "identity_calls": sum(r.get("identity_calls") or 0 for r in numbers) if any("identity_calls" in r for r in numbers) else None,
        "refresh_grants": (sum(r["refresh_grants"] for r in numbers if r.get("refresh_grants") is not None)
                           if any("refresh_grants" in r for r in numbers) else None),
        "rss_max": max((r["rss_max_kib"] for r in numbers if r.get("rss_max_kib")), default=None),
        "hwm": max((r["hwm_kib"] for r in numbers if r.get("hwm_kib")), default=None),
        "checked": sum(r.get("checked") or 0 for r in numbers),
        "responses": sum(r.get("check_responses") or 0 for r in numbers),
    }


def spread_text(s):
    """A side's spread as the report shows it (bold over 10 %)."""
    if s is None or s.get("rps") is None:
        return "-"
    if s["measured"] < 2:
        return "n/a (1 run)"
    text = f"{s['spread'] * 100:.1f} %"
    return f"**{text} > 10 %**" if s["spread"] > SPREAD_FLAG else text


def mib(kib):
    """KiB as MiB, or n/a."""
    return f"{kib / 1024:.1f} MiB" if kib else "n/a"


class Results:
    """What the report and the goals read."""

    def __init__(self):
        self.runs = {}          # (target, side) -> [run dict]
        self.failed = {}        # (target, side) -> reason
        self.notes = []
        self.instances = []     # Gatehouse instances: name, targets, ready_ms, rss_ready_kib
        self.peer_notes = {}
        self.token_rows = []
        self.token_notes = []
        self.capacity = []
        self.capacity_notes = []
        self.storms = []
        self.storm_files = []   # storm-*.json, one per storm
        self.storm_versions = []
        self.storm_failed = ""
        self.footprint_mib = None
        self.footprint_text = ""
        self.fa_decision = ""   # forward-auth: Gatehouse's answer to a decision asked directly, before the load
        self.fa_refusal = ""    # the same without a token
        self.fa_notes = []
        self.profile = {}       # target -> its perf profile (perf_buckets.py's table)
        self.profile_how = {}   # target -> which run it is of (the last round, or an extra one after a missed goal)
        self.wrk_shown = {}     # "target/side" -> command
        self.failover = None    # the failover target: figures, how the test failed, its log (bench.failover)
        self._summary = {}

    def side(self, target, side):
        key = (target, side)
        if key not in self._summary:
            self._summary[key] = summarize(self.runs.get(key))
        return self._summary[key]

    def part(self, target, side, name):
        """The median CPU µs per request of one part of a side (cpu_parts: "proxy", "gatehouse"),
        or None when the side has no valid runs."""
        s = self.side(target, side)
        if not s or not s["valid"]:
            return None
        values = [r["cpu_parts"][name] for r in self.runs.get((target, side), [])
                  if r.get("rps") is not None and name in (r.get("cpu_parts") or {})]
        return statistics.median(values) if values else None
