"""CPU accounting from /proc (bench.proc): read from this test's own process, nothing started."""

import os

from bench.proc import cpu_delta, cpu_snapshot, cpu_ticks, descendants, vm_kib


def test_cpu_delta_counts_new_processes_from_zero():
    assert cpu_delta({1: 10, 2: 5}, {1: 15, 2: 5, 3: 4}) == 9
    assert cpu_delta({}, {}) == 0


def test_this_process_is_read():
    me = os.getpid()
    assert descendants(me)[0] == me
    ticks = cpu_ticks(me)
    sum(i * i for i in range(200_000))  # some CPU time
    assert cpu_ticks(me) >= ticks >= 0
    assert me in cpu_snapshot([me], tree=False)
    rss, hwm = vm_kib(me)
    assert 0 < rss <= hwm


def test_a_process_that_is_gone():
    assert cpu_ticks(2**22 + 12345) is None
    assert vm_kib(2**22 + 12345) == (None, None)
