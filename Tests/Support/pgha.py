"""A real PostgreSQL high-availability stack for the end-to-end tests: Patroni (PyPI, in the
suite's .venv) managing two Debian PostgreSQL clusters through a one-member etcd (Debian's
etcd-server), with HAProxy in front routing to whichever node Patroni's REST API calls the
primary (`option httpchk GET /primary`, the pattern Patroni documents). Everything listens on
free loopback ports; nothing is a double.

    with PatroniStack(workdir, synchronous=True) as stack:
        stack.proxy                     # "127.0.0.1:PORT": HAProxy, always the primary
        stack.hosts                     # ["127.0.0.1:P1", "127.0.0.1:P2"]: the two servers
        stack.psql("SELECT 1")          # as user gatehouse, database gatehouse, through HAProxy
        new = stack.switchover()        # planned: Patroni's POST /switchover
        killed = stack.kill_primary()   # unplanned: SIGKILL of its Patroni and its postmaster
        stack.wait_primary(60, not_=killed)
        stack.restart_node(killed)      # rejoins as a replica (pg_rewind if it must)

Gatehouse connects as user `gatehouse` (no password, trust on 127.0.0.1), database `gatehouse`,
which it owns (it creates its tables in schema public); the superuser is `postgres`.

As root (CI), PostgreSQL and Patroni run as the `postgres` user (PostgreSQL refuses root, as in
scripts/postgres); their files (data directories, Patroni's configuration, PostgreSQL's log)
are then in a directory of their own under the system's temporary directory, since pytest's
are private to root; it is linked from the stack's folder in `workdir` as `runtime` while the
stack runs, and PostgreSQL's logs are copied into that folder when it stops. The logs of etcd,
each Patroni and HAProxy are written to the stack's folder directly.

Timings are the smallest Patroni accepts (its validator and Config._validate_and_adjust_timeouts):
ttl 20 s, loop_wait 1 s, retry_timeout 3 s. A primary that dies without releasing its leader
lock is therefore replaced once its lock expires: up to 20 s after its last renewal.

Synchronous mode is Patroni's `synchronous_mode: true` without `synchronous_mode_strict`: a
commit waits for the replica while it is there, and Patroni never promotes a replica that was
not synchronous, so no acknowledged commit is lost on failover; when the replica is gone
(killed, restarting) Patroni empties synchronous_standby_names and the primary keeps accepting
writes, which a two-node stack needs to stay writable after a kill (strict mode would block
every commit until a second node is back). `strict=True` gives the strict mode.
"""

import atexit
import contextlib
import ctypes
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

#: Patroni's minimums (patroni/validator.py: ttl >= 20, loop_wait >= 1, retry_timeout >= 3;
#: loop_wait + 2 * retry_timeout <= ttl).
TTL, LOOP_WAIT, RETRY_TIMEOUT = 20, 1, 3

INSTALL_HINT = {
    "etcd": "etcd is not installed: scripts/system-packages etcd-server (Debian's etcd-server)",
    "haproxy": "haproxy is not installed: scripts/system-packages haproxy",
    "postgresql": "PostgreSQL is not installed: scripts/system-packages postgresql",
    "patroni": "patroni is not in the suite's Python environment: scripts/python-env "
               "(Tests/requirements.txt pins patroni[etcd3,psycopg3])",
}

_PR_SET_PDEATHSIG = 1
try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux
    _prctl = None


def _die_with_parent():
    """In the child, before exec: SIGKILL when the process that started it dies, so a test run
    killed outright leaves no etcd, HAProxy or Patroni behind (PostgreSQL itself is detached by
    Patroni; stop() and atexit handle it)."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(path, lines=40):
    """The last `lines` lines of a log, for an error message."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as error:
        return f"   ({path}: {error})"
    return "\n".join("   | " + line for line in text.splitlines()[-lines:]) or f"   ({path} is empty)"


def _pg_bin():
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"),
                        key=lambda path: int(path.parent.parent.name) if path.parent.parent.name.isdigit() else 0)
    if not candidates:
        raise RuntimeError(INSTALL_HINT["postgresql"])
    preferred = Path("/usr/lib/postgresql/15/bin")
    return preferred if (preferred / "postgres").exists() else candidates[-1].parent


RUNTIME_PREFIX = "gatehouse-pgha-"


def _start_time(pid):
    """A process's start time (field 22 of /proc/PID/stat), to tell it from a later one with its pid."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


class StackError(RuntimeError):
    pass


class Node:
    """One Patroni member: its PostgreSQL port, REST port, files and process."""

    def __init__(self, name, runtime, stack_dir):
        self.name = name
        self.port = free_port()
        self.rest_port = free_port()
        self.dir = runtime / name
        self.data_dir = self.dir / "data"
        self.config = self.dir / "patroni.yml"
        self.pg_log_dir = self.dir / "log"
        self.pg_log = self.pg_log_dir / "postgresql.log"
        self.patroni_log = stack_dir / f"patroni-{name}.log"
        self.process = None

    @property
    def host(self):
        return f"127.0.0.1:{self.port}"

    @property
    def rest(self):
        return f"http://127.0.0.1:{self.rest_port}"

    def postmaster_pid(self):
        """The postmaster's pid from DATA/postmaster.pid, if the file is there and that process runs."""
        try:
            pid = int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return None
        return pid if b"postgres" in cmdline else None


class PatroniStack:
    """etcd + two Patroni-managed PostgreSQL nodes + HAProxy; see the module's docstring.

    Attributes: `proxy`, `hosts`, `nodes` (names), `dir` (the stack's folder in workdir),
    `scope`, `startup_seconds` (time start() took), `timings` (seconds per phase)."""

    def __init__(self, workdir, synchronous=True, *, strict=False, names=("pg1", "pg2"), startup_timeout=90):
        self.synchronous = synchronous
        self.strict = strict
        self.scope = "gatehouse-" + secrets.token_hex(4)
        self.dir = Path(workdir) / f"pgha-{self.scope}"
        self.startup_timeout = startup_timeout
        self._names = tuple(names)
        self._processes = {}  # "etcd", "haproxy" -> Popen (Patroni's are on their Node)
        self._nodes = {}
        self._runtime = None
        self._separate_runtime = False
        self._postgres_user = None
        self._stopped = False
        self._lock = threading.Lock()
        self.startup_seconds = None
        self.timings = {}

    # -- the public surface ---------------------------------------------------------------

    @property
    def proxy(self):
        return f"127.0.0.1:{self._proxy_port}"

    @property
    def hosts(self):
        return [node.host for node in self._nodes.values()]

    @property
    def nodes(self):
        return list(self._nodes)

    def host(self, name):
        """"127.0.0.1:PORT" of node `name`'s PostgreSQL."""
        return self._nodes[name].host

    def node_of(self, host):
        """The name of the node at "127.0.0.1:PORT"."""
        return next(name for name, node in self._nodes.items() if node.host == host)

    def log(self, name):
        """PostgreSQL's log of node `name` (where it is now: the runtime folder while running)."""
        node = self._nodes[name]
        copied = self.dir / f"postgresql-{name}.log"
        return copied if self._stopped and copied.exists() else node.pg_log

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    def start(self):
        began = time.monotonic()
        atexit.register(self.stop)
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - began
        return self

    def primary(self):
        """The name of the member Patroni calls the leader now (its /cluster, asked of any
        member that answers), or None."""
        document = self.cluster()
        leaders = [member["name"] for member in (document or {}).get("members", [])
                   if member.get("role") in ("leader", "primary")]
        return leaders[0] if leaders else None

    def cluster(self):
        """Patroni's /cluster document (members, roles, states, lags), from any member that answers."""
        for node in self._nodes.values():
            try:
                status, body = self._rest(node, "GET", "/cluster")
            except OSError:
                continue
            if status == 200:
                return json.loads(body)
        return None

    def wait_primary(self, timeout=60, not_=None, proxy=True):
        """The name of the primary once there is one (other than `not_` if given) that answers
        200 on Patroni's /primary and is writable (not in recovery, read-write); with `proxy`,
        also once HAProxy routes to it alone (its stats show that server UP and every other one
        DOWN) and a connection through HAProxy reaches it."""
        deadline = time.monotonic() + timeout
        while True:
            name, seen = self._primary_ready(not_, proxy)
            if name is not None:
                return name
            if time.monotonic() > deadline:
                raise StackError(f"no writable primary{f' other than {not_}' if not_ else ''} within {timeout} s "
                                 f"(last seen: {seen})\n" + self._diagnostics())
            time.sleep(0.05)

    def _primary_ready(self, not_=None, proxy=True):
        """(name, None) when wait_primary's conditions hold, else (None, what was seen)."""
        seen = "no member answered 200 on /primary"
        for name, node in self._nodes.items():
            if name == not_ or not self._alive(node):
                continue
            try:
                status, _ = self._rest(node, "GET", "/primary")
            except OSError as error:
                seen = f"{name}'s REST API: {error}"
                continue
            if status != 200:
                continue
            try:
                recovery, read_only = self._query(node.host, "SELECT pg_is_in_recovery(), current_setting('transaction_read_only')",
                                                  user="postgres", dbname="postgres")[0]
            except Exception as error:  # psycopg.Error, or the server not up yet
                return None, f"{name} answers /primary but its PostgreSQL: {error}"
            if recovery or read_only != "off":
                return None, f"{name} answers /primary but is in recovery={recovery}, read only={read_only}"
            if proxy:
                states = self.proxy_states()
                others = {server: state for server, state in states.items() if server != name}
                if states.get(name) != "UP" or any(not state.startswith("DOWN") for state in others.values()):
                    return None, f"{name} is the primary; HAProxy's servers: {states}"
                try:
                    port, recovery = self._query(self.proxy, "SELECT inet_server_port(), pg_is_in_recovery()",
                                                 user="postgres", dbname="postgres")[0]
                except Exception as error:
                    return None, f"{name} is the primary; a connection through HAProxy: {error}"
                if port != node.port or recovery:
                    return None, f"{name} is the primary; HAProxy reached port {port} (in recovery: {recovery})"
            return name, None
        return None, seen

    def wait_replica_streaming(self, timeout=60, write_wal=False):
        """The name of the replica once every running member other than the primary streams
        from it (pg_stat_replication state 'streaming', Patroni's state 'streaming') and, in
        synchronous mode, once Patroni has made it the synchronous standby (sync_state 'sync').

        With `write_wal`, a transaction id is taken on the primary every half second meanwhile:
        a replica rewound by pg_rewind is consistent (accepts connections, and Patroni calls it
        streaming) only once it has replayed up to where the primary's WAL was at the rewind,
        which an idle primary flushes only with its next WAL record (its background writer's,
        up to 15 s later)."""
        deadline = time.monotonic() + timeout
        seen = "no primary"
        nudged = 0.0
        while time.monotonic() < deadline:
            leader = self.primary()
            if leader is not None and write_wal and time.monotonic() - nudged > 0.5:
                nudged = time.monotonic()
                with contextlib.suppress(Exception):
                    self._query(self._nodes[leader].host, "SET synchronous_commit = local; SELECT txid_current()",
                                user="postgres", dbname="postgres")
            if leader is not None:
                replicas = [name for name, node in self._nodes.items() if name != leader and self._alive(node)]
                try:
                    rows = self._query(self._nodes[leader].host,
                                       "SELECT application_name, state, sync_state FROM pg_stat_replication",
                                       user="postgres", dbname="postgres")
                except Exception as error:
                    rows, seen = None, f"pg_stat_replication on {leader}: {error}"
                if rows is not None:
                    states = {name: (state, sync) for name, state, sync in rows}
                    members = {member["name"]: (member.get("role"), member.get("state"))
                               for member in (self.cluster() or {}).get("members", [])}
                    seen = f"primary {leader}; pg_stat_replication {states}; Patroni's roles and states {members}"
                    wanted = ("sync", ("sync_standby", "streaming")) if self.synchronous else ("async", ("replica", "streaming"))
                    # In synchronous mode Patroni's own record (its /sync key, shown as the role
                    # sync_standby) must name the replica too: it is written a moment after
                    # synchronous_standby_names, and a switchover to a replica it does not name is
                    # refused or dropped.
                    if replicas and all(states.get(name, (None, None)) == ("streaming", wanted[0]) and members.get(name) == wanted[1]
                                        for name in replicas):
                        return replicas[0] if len(replicas) == 1 else replicas
            time.sleep(0.05)
        raise StackError(f"no streaming replica within {timeout} s (last seen: {seen})\n" + self._diagnostics())

    def sync_state(self):
        """{replica name: sync_state} from the primary's pg_stat_replication ('sync', 'async',
        'potential', 'quorum')."""
        leader = self.primary()
        if leader is None:
            raise StackError("no primary to read pg_stat_replication from\n" + self._diagnostics())
        rows = self._query(self._nodes[leader].host, "SELECT application_name, sync_state FROM pg_stat_replication",
                           user="postgres", dbname="postgres")
        return dict(rows)

    def switchover(self, timeout=60):
        """A planned switchover (Patroni's POST /switchover, leader and candidate named) to the
        other member; returns the new primary once it is writable and HAProxy routes to it alone
        (wait_primary's conditions). Patroni restarts the old primary as a replica; wait for it
        with wait_replica_streaming(). `timings["switchover"]` is the time from the request to
        the new primary behind HAProxy. A request Patroni refuses or drops (412, 503) is made
        again until `timeout`."""
        self.wait_replica_streaming(timeout)
        leader = self.primary()
        candidate = next(name for name in self._nodes if name != leader)
        deadline = time.monotonic() + timeout
        replies = []

        def post():
            try:
                replies.append(self._rest(self._nodes[leader], "POST", "/switchover",
                                          {"leader": leader, "candidate": candidate}, timeout=timeout))
            except OSError as error:
                replies.append((None, str(error)))

        began = time.monotonic()
        # Patroni answers the POST once its own 1 s poll sees the new leader: the request runs in a
        # thread, while this loop sees the new primary (behind HAProxy) as soon as it is there.
        thread = None
        while True:
            if thread is None or not thread.is_alive():
                if thread is not None and replies and replies[-1][0] != 200:
                    if self.primary() != leader:
                        raise StackError(f"POST /switchover {leader} -> {candidate} answered {replies[-1]} and "
                                         f"the leader is now {self.primary()}\n" + self._diagnostics())
                    self.wait_replica_streaming(max(1, deadline - time.monotonic()))
                if thread is None or replies[-1][0] != 200:
                    thread = threading.Thread(target=post, daemon=True)
                    thread.start()
            new, seen = self._primary_ready(not_=leader)
            if new is not None:
                break
            if time.monotonic() > deadline:
                raise StackError(f"switchover {leader} -> {candidate} not done within {timeout} s (last seen: {seen}; "
                                 f"Patroni's answers: {replies})\n" + self._diagnostics())
            time.sleep(0.05)
        self.timings["switchover"] = time.monotonic() - began
        thread.join(max(1, deadline - time.monotonic()))
        if new != candidate:
            raise StackError(f"switchover to {candidate} made {new} the primary")
        return new

    def kill_primary(self):
        """An unplanned failure: SIGKILL of the primary's Patroni (its process group) and of its
        postmaster with all its backends (the postmaster's process group: Patroni starts it in
        a session of its own), so nothing demotes cleanly and the leader lock stays until its
        ttl expires. Returns the killed node's name."""
        leader = self.primary()
        if leader is None:
            raise StackError("no primary to kill\n" + self._diagnostics())
        node = self._nodes[leader]
        postmaster = node.postmaster_pid()
        self._kill_patroni(node)
        if postmaster is not None:
            self._kill_postmaster(postmaster)
        return leader

    def restart_node(self, name, wait=True, timeout=90):
        """Starts node `name`'s Patroni again (after kill_primary or stop_node); it rejoins as a
        replica, through pg_rewind when its timeline diverged. With `wait`, returns once it
        streams (wait_replica_streaming(write_wal=True))."""
        node = self._nodes[name]
        if self._alive(node):
            raise StackError(f"{name}'s Patroni is still running")
        self._start_patroni(node)
        if wait:
            self.wait_replica_streaming(timeout, write_wal=True)
        return name

    def stop_node(self, name, timeout=30):
        """Stops node `name` cleanly (SIGTERM to its Patroni, which stops its PostgreSQL)."""
        self._stop_patroni(self._nodes[name], timeout)

    def proxy_states(self):
        """{server: status} from HAProxy's stats ("UP", "DOWN", "UP 1/2" going down…)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self._stats_port}/stats;csv", timeout=2) as response:
                text = response.read().decode()
        except OSError:
            return {}
        lines = text.splitlines()
        if not lines:
            return {}
        header = lines[0].lstrip("# ").split(",")
        pxname, svname, status = header.index("pxname"), header.index("svname"), header.index("status")
        states = {}
        for line in lines[1:]:
            fields = line.split(",")
            if len(fields) > status and fields[pxname] == "postgres" and fields[svname] in self._nodes:
                states[fields[svname]] = fields[status]
        return states

    def psql(self, sql, host=None, *, params=None, user="gatehouse", dbname="gatehouse"):
        """Runs `sql` (autocommit) on `host` ("127.0.0.1:PORT"; HAProxy by default) as `user`;
        returns the rows (a list of tuples; [] for a statement without rows). A failure raises
        psycopg's error, with its `sqlstate`."""
        return self._query(host or self.proxy, sql, params=params, user=user, dbname=dbname)

    def stop(self):
        """Stops everything it started: HAProxy, each Patroni (SIGTERM, then SIGKILL), each
        postmaster still running (SIGKILL of its process group), etcd. Safe to call twice."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)
        self._terminate(self._processes.get("haproxy"), 5)
        postmasters = {name: node.postmaster_pid() for name, node in self._nodes.items()}
        for node in self._nodes.values():
            if self._alive(node):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(node.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for node in self._nodes.values():
            if node.process is not None:
                try:
                    node.process.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    self._kill_patroni(node)
        for name, node in self._nodes.items():
            pid = node.postmaster_pid() or postmasters.get(name)
            if pid is not None and Path(f"/proc/{pid}").exists():
                self._kill_postmaster(pid)
        self._terminate(self._processes.get("etcd"), 10)
        for name, node in self._nodes.items():
            if self._separate_runtime and node.pg_log_dir.exists():
                for log in sorted(node.pg_log_dir.glob("*")):
                    with contextlib.suppress(OSError):
                        shutil.copyfile(log, self.dir / f"postgresql-{name}.log" if log.name == "postgresql.log"
                                        else self.dir / f"postgresql-{name}-{log.name}")
        if self._separate_runtime and self._runtime is not None:
            shutil.rmtree(self._runtime, ignore_errors=True)
            with contextlib.suppress(OSError):
                (self.dir / "runtime").unlink()

    # -- starting -------------------------------------------------------------------------

    def _start(self):
        etcd, haproxy = shutil.which("etcd"), shutil.which("haproxy") or (Path("/usr/sbin/haproxy") if Path("/usr/sbin/haproxy").exists() else None)
        if etcd is None:
            raise StackError(INSTALL_HINT["etcd"])
        if haproxy is None:
            raise StackError(INSTALL_HINT["haproxy"])
        self._patroni = Path(sys.executable).parent / "patroni"
        if not self._patroni.exists():
            raise StackError(INSTALL_HINT["patroni"] + f" (no {self._patroni})")
        self._bin = _pg_bin()
        self.dir.mkdir(parents=True)
        if os.geteuid() == 0:
            try:
                self._postgres_user = pwd.getpwnam("postgres")
            except KeyError:
                raise StackError("running as root, the stack runs PostgreSQL and Patroni as the postgres user, "
                                 "which does not exist: " + INSTALL_HINT["postgresql"]) from None
            self._sweep_orphans()
            self._runtime = Path(tempfile.mkdtemp(prefix=RUNTIME_PREFIX))
            (self._runtime / "owner").write_text(f"{os.getpid()} {_start_time(os.getpid())}\n")
            os.chown(self._runtime, self._postgres_user.pw_uid, self._postgres_user.pw_gid)
            os.chmod(self._runtime, 0o700)
            self._separate_runtime = True
            (self.dir / "runtime").symlink_to(self._runtime)
        else:
            self._runtime = self.dir
        self._patroni_argv, self._patroni_extra_env = self._patroni_command()
        for name in self._names:
            self._nodes[name] = Node(name, self._runtime, self.dir)
        self._etcd_port, self._etcd_peer_port = free_port(), free_port()
        self._proxy_port, self._stats_port = free_port(), free_port()

        began = time.monotonic()
        self._start_etcd(etcd)
        self.timings["etcd"] = time.monotonic() - began
        for node in self._nodes.values():
            self._write_patroni_config(node)
            self._start_patroni(node)
        self._start_haproxy(haproxy)
        leader = self.wait_primary(self.startup_timeout)
        self.timings["primary"] = time.monotonic() - began
        self._create_gatehouse_database(leader)
        self.wait_replica_streaming(self.startup_timeout)
        self.timings["replica"] = time.monotonic() - began

    @staticmethod
    def _sweep_orphans():
        """PostgreSQL servers a stack left behind when the process that ran it was killed
        outright (SIGKILL: no stop(); etcd, HAProxy and Patroni die with it, but Patroni's
        postmasters are detached): in a runtime folder whose owner process is gone, they are
        killed and the folder removed."""
        for runtime in Path(tempfile.gettempdir()).glob(RUNTIME_PREFIX + "*"):
            try:
                pid, started = (runtime / "owner").read_text().split()
            except (OSError, ValueError):
                continue
            if _start_time(int(pid)) == started:
                continue  # its stack still runs
            for pidfile in runtime.glob("*/data/postmaster.pid"):
                try:
                    postmaster = int(pidfile.read_text().split("\n", 1)[0])
                    cmdline = Path(f"/proc/{postmaster}/cmdline").read_bytes()
                except (OSError, ValueError):
                    continue
                if str(pidfile.parent).encode() in cmdline:
                    PatroniStack._kill_postmaster(postmaster)
            shutil.rmtree(runtime, ignore_errors=True)

    def _patroni_command(self):
        """How the postgres user runs the venv's Patroni. The venv's own interpreter when that
        user can run it; otherwise (a venv made from an interpreter under /root, as pyenv's) the
        system's interpreter of the same version with the venv's site-packages alone on its path
        (-S: not the system's dist-packages, whose builds do not match the venv's)."""
        if self._postgres_user is None:
            return [str(self._patroni)], {}
        failures = []
        try:
            result = subprocess.run([str(self._patroni), "--version"], capture_output=True, text=True, timeout=60,
                                    cwd=self._runtime, **self._as_postgres())
        except OSError as error:  # its interpreter is where postgres cannot go
            failures.append(f"{self._patroni}: {error}")
        else:
            if result.returncode == 0:
                return [str(self._patroni)], {}
            failures.append(f"{self._patroni}: {(result.stderr or result.stdout).strip()[-300:]}")
        import sysconfig
        paths = sysconfig.get_paths()
        pythonpath = os.pathsep.join(dict.fromkeys([paths["purelib"], paths["platlib"]]))
        version = f"python{sys.version_info.major}.{sys.version_info.minor}"
        for interpreter in (f"/usr/bin/{version}", f"/usr/local/bin/{version}"):
            if not Path(interpreter).exists():
                continue
            argv = [interpreter, "-s", "-S", "-m", "patroni"]
            result = subprocess.run([*argv, "--version"], capture_output=True, text=True, timeout=60, cwd=self._runtime,
                                    env={**self._patroni_env(), "PYTHONPATH": pythonpath}, **self._as_postgres())
            if result.returncode == 0:
                return argv, {"PYTHONPATH": pythonpath}
            failures.append(f"{interpreter}: {(result.stderr or result.stdout).strip()[-300:]}")
        raise StackError("the postgres user can run neither the venv's patroni nor a system " + version +
                         " with the venv's packages (every folder above the .venv must be readable by others, "
                         "or the venv made from a system python3: PYTHON=/usr/bin/python3 scripts/python-env):\n   "
                         + "\n   ".join(failures))

    def _as_postgres(self):
        if self._postgres_user is None:
            return {}
        return {"user": self._postgres_user.pw_uid, "group": self._postgres_user.pw_gid, "extra_groups": []}

    def _spawn(self, argv, log, as_postgres=False, env=None):
        out = open(log, "ab")
        try:
            process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                       start_new_session=True, preexec_fn=_die_with_parent, env=env,
                                       cwd=self._runtime if as_postgres else self.dir,
                                       **(self._as_postgres() if as_postgres else {}))
        finally:
            out.close()
        return process

    def _start_etcd(self, etcd):
        log = self.dir / "etcd.log"
        client, peer = f"http://127.0.0.1:{self._etcd_port}", f"http://127.0.0.1:{self._etcd_peer_port}"
        self._processes["etcd"] = self._spawn([
            etcd, "--name", "etcd", "--data-dir", str(self.dir / "etcd"),
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"etcd={peer}", "--initial-cluster-state", "new",
            "--initial-cluster-token", self.scope, "--logger", "zap", "--log-outputs", "stderr",
        ], log)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self._processes["etcd"].poll() is not None:
                raise StackError(f"etcd exited ({self._processes['etcd'].returncode}); {log}:\n{tail(log)}")
            with contextlib.suppress(OSError, ValueError):
                with urllib.request.urlopen(client + "/health", timeout=1) as response:
                    if json.loads(response.read()).get("health") == "true":
                        return
            time.sleep(0.05)
        raise StackError(f"etcd not healthy within 30 s; {log}:\n{tail(log)}")

    def _write_patroni_config(self, node):
        node.dir.mkdir()
        node.pg_log_dir.mkdir()
        if self._postgres_user is not None:
            for path in (node.dir, node.pg_log_dir):
                os.chown(path, self._postgres_user.pw_uid, self._postgres_user.pw_gid)
        hba = ["local all all trust", "host all all 127.0.0.1/32 trust", "host replication all 127.0.0.1/32 trust"]
        config = {
            "scope": self.scope,
            "name": node.name,
            "log": {"level": "INFO"},
            "restapi": {"listen": f"127.0.0.1:{node.rest_port}", "connect_address": f"127.0.0.1:{node.rest_port}"},
            "etcd3": {"host": f"127.0.0.1:{self._etcd_port}"},
            "watchdog": {"mode": "off"},
            "bootstrap": {
                "dcs": {
                    "ttl": TTL, "loop_wait": LOOP_WAIT, "retry_timeout": RETRY_TIMEOUT,
                    "maximum_lag_on_failover": 1048576,
                    # A primary whose PostgreSQL crashes (Patroni alive) is failed over at once,
                    # not restarted in place for 300 s.
                    "primary_start_timeout": 0,
                    "synchronous_mode": bool(self.synchronous),
                    "synchronous_mode_strict": bool(self.synchronous and self.strict),
                    "postgresql": {
                        "use_pg_rewind": True,
                        "use_slots": True,
                        "parameters": {
                            "max_connections": 300,
                            "wal_level": "replica",
                            "hot_standby": "on",
                            "wal_log_hints": "on",  # pg_rewind
                            "max_wal_senders": 10,
                            "max_replication_slots": 10,
                            "wal_keep_size": "128MB",
                            # The data is throwaway and the machine does not crash in a test: no
                            # fsync (a SIGKILLed server's writes are in the page cache all the same).
                            "fsync": "off",
                            "full_page_writes": "on",
                        },
                    },
                },
                "initdb": [{"encoding": "UTF8"}, {"locale": "C.UTF-8"}, {"auth": "trust"}],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{node.port}",
                "connect_address": f"127.0.0.1:{node.port}",
                "data_dir": str(node.data_dir),
                "bin_dir": str(self._bin),
                "pgpass": str(node.dir / "pgpass"),
                "authentication": {
                    "superuser": {"username": "postgres"},
                    "replication": {"username": "replicator"},
                    "rewind": {"username": "postgres"},
                },
                "pg_hba": hba,
                "basebackup": [{"checkpoint": "fast"}],
                "remove_data_directory_on_rewind_failure": True,
                "remove_data_directory_on_diverged_timelines": True,
                "parameters": {
                    "unix_socket_directories": str(node.dir),
                    "logging_collector": "on",
                    "log_directory": str(node.pg_log_dir),
                    "log_filename": "postgresql.log",
                    "log_file_mode": "0644",
                    "log_rotation_age": 0,
                    "log_rotation_size": 0,
                    "log_line_prefix": "%m [%p] %q%u@%d ",
                },
            },
            "tags": {"nofailover": False, "noloadbalance": False, "clonefrom": False, "nosync": False},
        }
        node.config.write_text(json.dumps(config, indent=2))  # JSON is YAML
        if self._postgres_user is not None:
            os.chown(node.config, self._postgres_user.pw_uid, self._postgres_user.pw_gid)

    def _patroni_env(self):
        env = {key: value for key, value in os.environ.items()
               if not key.startswith(("PG", "PATRONI_")) and key not in ("PYTHONPATH",)}
        env.update(LANG="C.UTF-8", LC_ALL="C.UTF-8")
        if self._postgres_user is not None:
            env.update(HOME=self._postgres_user.pw_dir, USER="postgres", LOGNAME="postgres")
        return env

    def _start_patroni(self, node):
        with open(node.patroni_log, "a") as log:
            log.write(f"==== {time.strftime('%H:%M:%S')} starting {' '.join(self._patroni_argv)} {node.config}\n")
        node.process = self._spawn([*self._patroni_argv, str(node.config)], node.patroni_log,
                                   as_postgres=True, env={**self._patroni_env(), **self._patroni_extra_env})

    def _start_haproxy(self, haproxy):
        config = self.dir / "haproxy.cfg"
        log = self.dir / "haproxy.log"
        servers = "\n".join(f"    server {name} {node.host} maxconn 500 check port {node.rest_port}"
                            for name, node in self._nodes.items())
        config.write_text(f"""\
# Patroni's documented HAProxy pattern: each PostgreSQL server is checked through its member's
# REST API, which answers GET /primary with 200 on the primary only.
global
    log stdout format raw local0
    maxconn 2000

defaults
    log global
    mode tcp
    option tcplog
    retries 2
    timeout connect 1s
    timeout client 30m
    timeout server 30m
    timeout check 1s

listen stats
    mode http
    bind 127.0.0.1:{self._stats_port}
    stats enable
    stats uri /stats
    stats refresh 1s

listen postgres
    bind 127.0.0.1:{self._proxy_port}
    option httpchk GET /primary
    http-check expect status 200
    default-server inter 1s fall 2 rise 1 on-marked-down shutdown-sessions
{servers}
""")
        check = subprocess.run([str(haproxy), "-c", "-f", str(config)], capture_output=True, text=True, timeout=30)
        if check.returncode != 0:
            raise StackError(f"haproxy -c refused {config}: {check.stdout}{check.stderr}")
        self._processes["haproxy"] = self._spawn([str(haproxy), "-db", "-f", str(config)], log)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self._processes["haproxy"].poll() is not None:
                raise StackError(f"haproxy exited ({self._processes['haproxy'].returncode}); {log}:\n{tail(log)}")
            if self.proxy_states():
                return
            time.sleep(0.05)
        raise StackError(f"haproxy's stats not answering within 15 s; {log}:\n{tail(log)}")

    def _create_gatehouse_database(self, leader):
        host = self._nodes[leader].host
        exists = self._query(host, "SELECT 1 FROM pg_roles WHERE rolname = 'gatehouse'", user="postgres", dbname="postgres")
        if not exists:
            self._query(host, "CREATE ROLE gatehouse LOGIN", user="postgres", dbname="postgres")
        if not self._query(host, "SELECT 1 FROM pg_database WHERE datname = 'gatehouse'", user="postgres", dbname="postgres"):
            self._query(host, "CREATE DATABASE gatehouse OWNER gatehouse", user="postgres", dbname="postgres")

    # -- processes ------------------------------------------------------------------------

    @staticmethod
    def _alive(node):
        return node.process is not None and node.process.poll() is None

    def _kill_patroni(self, node):
        if node.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            node.process.wait(10)

    def _stop_patroni(self, node, timeout):
        if not self._alive(node):
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.process.pid, signal.SIGTERM)
        try:
            node.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self._kill_patroni(node)

    @staticmethod
    def _kill_postmaster(pid):
        """SIGKILL of the postmaster and its backends: its process group (Patroni's starter calls
        setsid, so the group holds PostgreSQL's processes only); the postmaster alone otherwise."""
        try:
            group = os.getpgid(pid)
        except ProcessLookupError:
            return
        if group > 1 and group != os.getpgrp():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            # Gone once reaped; a zombie (no init reaping in some containers) has an empty cmdline.
            with contextlib.suppress(OSError):
                if not Path(f"/proc/{pid}/cmdline").read_bytes():
                    break
            time.sleep(0.02)

    @staticmethod
    def _terminate(process, timeout):
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)

    # -- talking to the members -----------------------------------------------------------

    @staticmethod
    def _rest(node, method, path, body=None, timeout=2):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(node.rest + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"} if data else {})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode(errors="replace")

    @staticmethod
    def _query(host, sql, params=None, user="gatehouse", dbname="gatehouse"):
        import psycopg
        address, port = host.rsplit(":", 1)
        with psycopg.connect(host=address, port=int(port), user=user, dbname=dbname, autocommit=True,
                             connect_timeout=3) as connection:
            cursor = connection.execute(sql, params)
            return cursor.fetchall() if cursor.description else []

    def _diagnostics(self):
        parts = []
        for name, node in self._nodes.items():
            state = "running" if self._alive(node) else f"exited ({node.process.returncode})" if node.process else "not started"
            parts.append(f"-- Patroni {name} ({state}), {node.patroni_log}:\n{tail(node.patroni_log, 25)}")
            parts.append(f"-- PostgreSQL {name}, {self.log(name)}:\n{tail(self.log(name), 15)}")
        for key in ("haproxy", "etcd"):
            log = self.dir / f"{key}.log"
            process = self._processes.get(key)
            state = "not started" if process is None else "running" if process.poll() is None else f"exited ({process.returncode})"
            parts.append(f"-- {key} ({state}), {log}:\n{tail(log, 10)}")
        return "\n".join(parts)
