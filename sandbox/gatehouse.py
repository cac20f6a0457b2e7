"""Gatehouse as a process, for the end-to-end tests, the demos and the benchmark: its configuration
written into a work folder, `gatehouse serve` started, its readiness waited for, its log kept, and
the process stopped. Standard library only (the benchmark imports it from the system's python).

    from sandbox import gatehouse
    config = gatehouse.server_and_store(port, "gatehouse.sqlite") + UPSTREAMS_AND_ROUTES
    with gatehouse.start(workdir, "gatehouse", config, env=env, log_level="debug") as running:
        running.url, running.port, running.process, running.log, running.config
        running.lines.wait_for(r"relay=fast")       # every stderr line, as it is written
    # stopped here: TERM, then KILL after 10 s

`start` returns once the "gatehouse is ready" line is out (`ready="port"`: once the port accepts a
connection, for a log level that hides the line; `ready=None`: at once). On a failure to start it
stops the process and raises RuntimeError with the end of the log.

Two ways to keep the log (WORKDIR/NAME.log unless `log=` names another file):
- `follow=True` (the default): stderr is read by a thread here, which copies each line to the log
  and into `running.lines` (a gatelog.LogFollower); stdout goes to the log directly.
- `follow=False`: stdout and stderr go straight into the log, nothing in this process reads them
  (the benchmark: no reader between Gatehouse and its log); readiness is read from the file.
"""

import os
import re
import socket
import subprocess
import threading
import time
from pathlib import Path

from .gatelog import LogFollower
from .secretsrecord import stop as stop_process

ROOT = Path(__file__).resolve().parents[1]
READY = "gatehouse is ready"


def gatehouse_binary(path=None):
    """The `gatehouse` executable: `path`, else $GATEHOUSE_BIN, else .build/debug/gatehouse;
    RuntimeError when it does not exist."""
    binary = Path(path or os.environ.get("GATEHOUSE_BIN") or ROOT / ".build/debug/gatehouse")
    if not binary.exists():
        raise RuntimeError(f"{binary} does not exist: build it first (swift build)")
    return binary


def generate_keys(path, binary=None):
    """A session key ring file at `path` (`gatehouse keys generate`), made only if it is missing."""
    path = Path(path)
    if not path.exists():
        subprocess.run([str(gatehouse_binary(binary)), "keys", "generate", "--file", str(path)],
                       check=True, capture_output=True, timeout=30)
    return path


def server_and_store(port, store):
    """The `server:` and `store:` sections of a Gatehouse on 127.0.0.1:PORT; `store` is a SQLite
    path or the YAML lines of a `postgres:` mapping."""
    store_section = f"  sqlite_path: {store}" if not str(store).lstrip().startswith("postgres:") else str(store)
    return f"""
server:
  public_base_url: http://127.0.0.1:{port}
  host: 127.0.0.1
  port: {port}
store:
{store_section}"""


def configured_port(config_text):
    """The `server.port` of a configuration written the way server_and_store writes it."""
    match = re.search(r"^  port: (\d+)\s*$", config_text, re.MULTILINE)
    if not match:
        raise ValueError("the configuration names no `  port:` of its server (pass port=)")
    return int(match.group(1))


class GatehouseProcess:
    """A started `gatehouse serve`: `url`, `port`, `process`, `config` and `log` (paths), `name`,
    `binary`, `lines` (a LogFollower, or None with follow=False), `ready_seconds` (from the start to
    readiness). `stop()` (or the end of a `with`) stops it unless it has exited already."""

    def __init__(self, name, binary, config, log, port, process, lines, sink, reader):
        self.name, self.binary, self.config, self.log, self.port = name, binary, config, log, port
        self.url = f"http://127.0.0.1:{port}"
        self.process, self.lines = process, lines
        self.ready_seconds = None
        self._sink, self._reader = sink, reader

    def log_tail(self, count=25):
        """The last `count` lines of the log, as one string."""
        if self.lines is not None:
            return "\n".join(self.lines.lines_since(0)[-count:])
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-count:])
        except OSError:
            return ""

    def wait_ready(self, how="line", timeout=30.0):
        """Waits for the ready line (`how="line"`) or the port to accept (`how="port"`); RuntimeError
        when the process exits first or `timeout` seconds pass."""
        started = time.monotonic()
        deadline = started + timeout
        while not self._is_ready(how):
            if self.process.poll() is not None or time.monotonic() > deadline:
                if self._reader is not None:
                    self._reader.join(2)
                raise RuntimeError(f"Gatehouse {self.name} did not become ready (exit status {self.process.poll()}); "
                                   f"its log {self.log}:\n{self.log_tail()}")
        self.ready_seconds = time.monotonic() - started

    def _is_ready(self, how):
        if how == "port":
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.05):
                    return True
            except OSError:
                time.sleep(0.005)  # polled: a closed port refuses at once
                return False
        if self.lines is not None:
            try:
                self.lines.wait_for(READY, timeout=0.2)  # woken by every new line
                return True
            except AssertionError:
                return False
        try:
            found = READY in self.log.read_text(errors="replace")
        except OSError:
            found = False
        if not found:
            time.sleep(0.005)  # polled: the log is a file nobody here reads
        return found

    def stop(self):
        if self.process.poll() is None:
            stop_process(self.process)
        if self._reader is not None:
            self._reader.join(5)
        if not self._sink.closed:
            self._sink.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def start(workdir, name, config, *, env=None, binary=None, port=None, log=None, log_level=None, log_format=None,
          args=(), follow=True, ready="line", ready_timeout=30.0):
    """Starts `gatehouse serve` and returns its GatehouseProcess once it is ready.

    `config`: YAML text, written to WORKDIR/NAME.yaml, or the path of a file used as it is.
    `port`: read from the configuration unless given. `env`: the process's environment (os.environ).
    `log_level`, `log_format`: `--log-level`, `--log-format` when given; `args`: more arguments.
    `follow`, `ready`, `ready_timeout`: see the module's docstring."""
    workdir = Path(workdir)
    binary = gatehouse_binary(binary)
    if isinstance(config, str):
        config_path = workdir / f"{name}.yaml"
        config_path.write_text(config)
        text = config
    else:
        config_path = Path(config)
        text = config_path.read_text()
    port = port or configured_port(text)
    log_path = Path(log) if log else workdir / f"{name}.log"
    command = [str(binary), "serve", "--config", str(config_path)]
    if log_level:
        command += ["--log-level", log_level]
    command += list(args)
    if log_format:
        command += ["--log-format", log_format]
    env = os.environ if env is None else env
    if follow:
        sink = open(log_path, "w")
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.PIPE, text=True, errors="replace", env=env)
        lines = LogFollower()
        reader = threading.Thread(target=_copy, args=(process.stderr, sink, lines), name=f"gatehouse-{name}-log", daemon=True)
        reader.start()
    else:
        sink = open(log_path, "wb")
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env)
        lines = reader = None
    running = GatehouseProcess(name, binary, config_path, log_path, port, process, lines, sink, reader)
    if ready:
        try:
            running.wait_ready(ready, ready_timeout)
        except BaseException:
            running.stop()
            raise
    return running


def _copy(stream, sink, lines):
    """Copies a process's stderr to its log file and its LogFollower, line by line, until it ends."""
    for line in iter(stream.readline, ""):
        sink.write(line)
        sink.flush()
        lines.feed(line)
