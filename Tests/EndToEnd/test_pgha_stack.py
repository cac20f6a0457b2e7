"""The PostgreSQL high-availability stack the failover tests stand on (Tests/Support/pgha.py),
alone, without Gatehouse: Patroni + etcd + HAProxy over two PostgreSQL servers, in
synchronous mode.

- The primary is writable through HAProxy (as user gatehouse, who creates a table); the replica
  is read-only: pg_is_in_recovery() there, and a write sent to it directly fails with SQLSTATE
  25006. The replica is the synchronous standby (pg_stat_replication's sync_state 'sync').
- A planned switchover moves the primary and HAProxy follows: a write through it lands on the
  new primary; a session opened through HAProxy before is cut; the old primary comes back as a
  read-only replica, synchronous again.
- A primary killed outright (its Patroni and its postmaster, SIGKILL) is replaced once its
  leader lock expires; what was committed before is on the new primary; the killed node, started
  again, rejoins as a synchronous replica with every row.

Nothing is skipped: without etcd, HAProxy, PostgreSQL or Patroni the stack fails, naming the
install step (scripts/system-packages, scripts/python-env).
"""

import time

import psycopg
import pytest

from pgha import PatroniStack

#: Patroni's smallest ttl (20 s): a killed primary's lock lasts that long after its last renewal.
FAILOVER_BOUND = 45


@pytest.fixture(scope="module")
def stack(workdir):
    with PatroniStack(workdir, synchronous=True) as stack:
        print(f"\n   HA stack up in {stack.startup_seconds:.1f} s (etcd {stack.timings['etcd']:.1f} s, "
              f"writable primary behind HAProxy {stack.timings['primary']:.1f} s, synchronous replica "
              f"{stack.timings['replica']:.1f} s); primary {stack.primary()}, proxy {stack.proxy}, hosts {stack.hosts}")
        yield stack


def port_of(host):
    return int(host.rsplit(":", 1)[1])


def wait_rows(stack, host, expected, timeout=10):
    """The notes of table ha_smoke read on `host`, once they are `expected` (a replica applies
    what the primary committed a moment later: synchronous_commit=on waits for its flush)."""
    deadline = time.monotonic() + timeout
    while True:
        notes = [row[0] for row in stack.psql("SELECT note FROM ha_smoke ORDER BY id", host=host)]
        if notes == expected or time.monotonic() > deadline:
            return notes
        time.sleep(0.05)


def test_primary_writable_through_proxy_and_replica_read_only(stack):
    primary = stack.wait_primary(30)
    replica = stack.wait_replica_streaming(30)
    assert replica != primary

    stack.psql("CREATE TABLE ha_smoke (id int PRIMARY KEY, note text NOT NULL)")
    stack.psql("INSERT INTO ha_smoke VALUES (1, 'before switchover')")
    [(port, in_recovery, user)] = stack.psql("SELECT inet_server_port(), pg_is_in_recovery(), current_user")
    assert (port, in_recovery, user) == (port_of(stack.host(primary)), False, "gatehouse")

    replica_host = stack.host(replica)
    assert stack.psql("SELECT pg_is_in_recovery()", host=replica_host) == [(True,)]
    with pytest.raises(psycopg.Error) as refused:
        stack.psql("INSERT INTO ha_smoke VALUES (2, 'on the replica')", host=replica_host)
    assert refused.value.sqlstate == "25006", refused.value
    print(f"\n   a write on the replica: SQLSTATE {refused.value.sqlstate} ({type(refused.value).__name__}): "
          f"{refused.value.diag.message_primary}")
    assert wait_rows(stack, replica_host, ["before switchover"]) == ["before switchover"]

    assert stack.sync_state() == {replica: "sync"}
    assert stack.proxy_states() == {primary: "UP", replica: "DOWN"}


def test_switchover_moves_the_primary_and_haproxy_follows(stack):
    old = stack.wait_primary(30)
    stack.wait_replica_streaming(30)
    session = psycopg.connect(host="127.0.0.1", port=port_of(stack.proxy), user="gatehouse", dbname="gatehouse",
                              autocommit=True)
    assert session.execute("SELECT inet_server_port()").fetchone()[0] == port_of(stack.host(old))

    new = stack.switchover()
    switched = time.monotonic()
    assert new != old and stack.primary() == new
    print(f"\n   switchover {old} -> {new}: writable through HAProxy after {stack.timings['switchover']:.1f} s")

    stack.psql("INSERT INTO ha_smoke VALUES (2, 'after switchover')")
    assert stack.psql("SELECT inet_server_port(), pg_is_in_recovery()") == [(port_of(stack.host(new)), False)]
    assert wait_rows(stack, stack.proxy, ["before switchover", "after switchover"]) == ["before switchover", "after switchover"]

    # The session opened through HAProxy before is gone (Patroni stopped the old primary to
    # demote it; HAProxy's on-marked-down shutdown-sessions would cut it too).
    with pytest.raises(psycopg.OperationalError) as cut:
        session.execute("SELECT 1")
    session.close()
    print(f"   a session opened through HAProxy before the switchover: {type(cut.value).__name__} "
          f"(SQLSTATE {cut.value.sqlstate}): {str(cut.value).strip().splitlines()[0]}")

    # The old primary comes back as a read-only replica that accepts connections.
    deadline = time.monotonic() + 30
    while True:
        try:
            if stack.psql("SELECT pg_is_in_recovery()", host=stack.host(old)) == [(True,)]:
                break
        except psycopg.OperationalError:
            pass
        assert time.monotonic() < deadline, f"{old} does not accept connections as a replica 30 s after the switchover"
        time.sleep(0.05)
    back = time.monotonic() - switched
    assert stack.wait_replica_streaming(30) == old
    print(f"   {old} accepts read-only connections {back:.1f} s after the switchover, is a synchronous "
          f"replica again {time.monotonic() - switched:.1f} s after it")
    assert stack.sync_state() == {old: "sync"}
    assert wait_rows(stack, stack.host(old), ["before switchover", "after switchover"]) == ["before switchover", "after switchover"]


def test_a_killed_primary_is_replaced_and_rejoins(stack):
    stack.wait_primary(30)
    stack.wait_replica_streaming(30)
    killed = stack.kill_primary()
    began = time.monotonic()
    new = stack.wait_primary(FAILOVER_BOUND, not_=killed)
    replaced = time.monotonic() - began
    print(f"\n   {killed} killed (SIGKILL of Patroni and postmaster): {new} writable through HAProxy after {replaced:.1f} s")
    with pytest.raises(psycopg.OperationalError):
        stack.psql("SELECT 1", host=stack.host(killed))

    stack.psql("INSERT INTO ha_smoke VALUES (3, 'after failover')")
    assert stack.psql("SELECT inet_server_port(), pg_is_in_recovery()") == [(port_of(stack.host(new)), False)]
    expected = ["before switchover", "after switchover", "after failover"]
    assert wait_rows(stack, stack.proxy, expected) == expected
    assert stack.sync_state() == {}  # alone: not strict, so commits do not wait for a replica

    began = time.monotonic()
    stack.restart_node(killed)
    print(f"   {killed} started again: a synchronous replica after {time.monotonic() - began:.1f} s")
    assert stack.primary() == new
    assert stack.sync_state() == {killed: "sync"}
    assert stack.psql("SELECT pg_is_in_recovery()", host=stack.host(killed)) == [(True,)]
    assert wait_rows(stack, stack.host(killed), expected) == expected
