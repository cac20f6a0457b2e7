"""CPU time, context switches and memory of processes, from /proc (Linux): a process and the
processes below it (nginx's master and workers), snapshots around a run and their difference."""

import os


CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_ticks(pid):
    """utime + stime of a process (all its threads), in clock ticks; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # After "pid (comm)": state is field 3; utime and stime are fields 14 and 15.
    return int(fields[11]) + int(fields[12])


def descendants(pid):
    """pid and every process below it (nginx: the master and its workers)."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return found


def vm_kib(pid):
    """(VmRSS, VmHWM) in KiB, or (None, None)."""
    rss = hwm = None
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
                elif line.startswith("VmHWM:"):
                    hwm = int(line.split()[1])
    except OSError:
        pass
    return rss, hwm


def count_lines(path):
    """The lines of a file so far (0 when it does not exist): the identity double's access log."""
    if not path or not os.path.exists(path):
        return 0
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def context_switches(pid):
    """Voluntary plus involuntary context switches of every thread of `pid` so far, or None."""
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/status") as status:
                for line in status:
                    if line.startswith(("voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:")):
                        total += int(line.split()[1])
        except (OSError, ValueError):
            continue  # a thread that ended meanwhile
    return total


def cpu_snapshot(pids, tree=True):
    """{pid: ticks} of each process (tree: and of every process below it), now."""
    seen = {}
    for root in pids:
        for p in (descendants(root) if tree else [root]):
            t = cpu_ticks(p)
            if t is not None:
                seen[p] = t
    return seen


def switches_snapshot(pids, tree=True):
    """{pid: context switches of all its threads} of each process (tree: and below it), now."""
    seen = {}
    for root in pids:
        for p in (descendants(root) if tree else [root]):
            n = context_switches(p)
            if n is not None:
                seen[p] = n
    return seen


def cpu_delta(before, after):
    """Ticks spent between two snapshots (processes that appeared count from 0)."""
    return sum(t - before.get(p, 0) for p, t in after.items())
