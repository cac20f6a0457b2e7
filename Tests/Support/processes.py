"""The suite's way of starting a Gatehouse and a django-oauth-toolkit of a test's own: sandbox's
starters (sandbox/gatehouse.py, sandbox/dot) with the suite's defaults (its secrets record, its
rate limits, debug logs, the dict the tests index).

    with run_upstream(workdir, "oidc-upstream", seen, [callback]) as upstream:   # {"url", "env"}
        with run_gatehouse(workdir, "gatehouse-x", config, upstream["env"]) as gatehouse:
            gatehouse["url"], gatehouse["lines"].wait_for(…)
"""

import os
import re
import secrets
from contextlib import contextmanager
from pathlib import Path

from sandbox import dot, gatehouse as gatehouse_process
from sandbox.nativeapp import APP_REDIRECT, PASSWORD, USERNAME


@contextmanager
def run_upstream(workdir, name, seen, callbacks, access_token_expire_seconds=3600, users=None, **options):
    """A django-oauth-toolkit of its own (sandbox/dot), with the `gatehouse-legacy` application (no
    PKCE, refresh rotation, grace 0) whose secret is in the yielded `env`."""
    env = dict(os.environ, UPSTREAM_SECRET_LEGACY=secrets.token_urlsafe(24))
    seen.add(env["UPSTREAM_SECRET_LEGACY"], kind="upstream client secret")
    config = {
        "users": users or [{"username": USERNAME, "password": PASSWORD, "email": "alice@example.test"}],
        "applications": [{"client_id": "gatehouse-legacy", "client_secret_env": "UPSTREAM_SECRET_LEGACY",
                          "redirect_uris": [*callbacks, APP_REDIRECT], "pkce_required": False}],
        "access_token_expire_seconds": access_token_expire_seconds,
        "rotate_refresh_token": True,
        "refresh_token_grace_period_seconds": 0,
        "allowed_redirect_uri_schemes": ["http", "https", "com.example.app"],
        **options,
    }
    with dot.run(workdir, name, config, env=env) as upstream:
        yield {"url": upstream.url, "env": env}


def session_keys(workdir, name, seen):
    """A session key ring file WORKDIR/NAME (made once), its keys registered with `seen` so the
    secret scans look for them."""
    keys = gatehouse_process.generate_keys(Path(workdir) / name)
    seen.add_key_ring(keys)
    return keys


# Every request of the suite comes from 127.0.0.1, where a deployment's come from many addresses:
# the per-address limits that are on by default (registrations, unknown refresh tokens) would
# count the whole suite as one client. They are turned off unless a test keeps the defaults
# (`default_limits=True`) or sets them itself; test_rate_limits checks the defaults.
SUITE_LIMITS = {"registration_per_address": "off", "registration_per_app": "off", "unknown_refresh_per_address": "off"}


def with_suite_limits(config):
    """`config` with the per-address limits of SUITE_LIMITS off, unless it sets them itself."""
    missing = {key: value for key, value in SUITE_LIMITS.items() if not re.search(rf"^\s+{key}:", config, re.MULTILINE)}
    if not missing:
        return config
    lines = "".join(f"  {key}: {value}\n" for key, value in missing.items())
    if re.search(r"^rate_limits:[ \t]*$", config, re.MULTILINE):
        return re.sub(r"^rate_limits:[ \t]*\n", lambda match: "rate_limits:\n" + lines, config, count=1, flags=re.MULTILINE)
    return config.rstrip("\n") + "\nrate_limits:\n" + lines


def as_dict(running):
    """What the tests index of a started Gatehouse (sandbox.gatehouse.GatehouseProcess)."""
    return {"url": running.url, "port": running.port, "process": running.process, "lines": running.lines,
            "config": running.config, "log": running.log, "name": running.name, "binary": running.binary}


@contextmanager
def run_gatehouse(workdir, name, config, env, log_level="debug", args=(), json_logs=False, extra_env=None, ready_timeout=30,
                  default_limits=False):
    """A Gatehouse of its own from the YAML text `config`, written to WORKDIR/NAME.yaml (with the
    suite's limits unless `default_limits`), its stderr followed in `lines` and copied to
    WORKDIR/NAME.log (the suite's log scan reads every *.log there; NAME.json.log when `json_logs`,
    which also passes `--log-format json`). Yields {"url", "port", "process", "lines", "config",
    "log", "name", "binary"} once its ready line is out; stopped afterwards."""
    workdir = Path(workdir)
    text = config if default_limits else with_suite_limits(config)
    with gatehouse_process.start(workdir, name, text, env=dict(env, **(extra_env or {})), log_level=log_level, args=args,
                                 log_format="json" if json_logs else None, ready_timeout=ready_timeout,
                                 log=workdir / (f"{name}.json.log" if json_logs else f"{name}.log")) as running:
        yield as_dict(running)
