"""Prometheus metrics (issue 11, item 1), end to end.

A Gatehouse of this module's own serves `/metrics` on a listener of its own
(`observability.metrics.listen`); Debian's Prometheus, started here on a loopback port, scrapes
it every second while a sign-in (the token endpoint, through the real django-oauth-toolkit), a
refresh and relayed calls (an identity-cache miss, then hits on the fast and the general path)
go through. The test then asks Prometheus's HTTP API for the series and their counts.

Also: `promtool check metrics` accepts the exposition; route labels are templates, never raw
paths; no token or secret reaches the exposition; `/metrics` is not on the public port unless
`observability.metrics.allow` names the caller's address.
"""

import json
import secrets
import subprocess

import pytest
import requests

from sandbox.gatelog import served_by
from sandbox.nativeapp import free_port
from operations import (identity, gateway, gateway_config, metric_sum, parse_exposition, poll, relay_sign_in,
                        route_yaml, scrape)

ROUTE = "/api/ops/*"
FAST_GETS = 5
GENERAL_POSTS = 3


def metrics_section(listen=None, allow=None):
    lines = ["observability:", "  metrics:"]
    if listen:
        lines.append(f"    listen: {listen}")
    if allow is not None:
        lines.append(f"    allow: [{', '.join(allow)}]")
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def metered(workdir, upstream, relay_doubles, seen, identity):
    """Gatehouse with `observability.metrics.listen` on a loopback port of its own."""
    port, metrics_port = free_port(), free_port()
    backend = relay_doubles["backend"].url
    routes = route_yaml("/api/ops", backend + "/ops", "legacy") + route_yaml("/api/raw", backend + "/raw", "legacy")
    config = gateway_config(port, workdir, "metrics", upstream["url"], identity.url_for_config, backend, seen,
                            routes=routes, sections=metrics_section(listen=f"127.0.0.1:{metrics_port}"))
    with gateway(workdir, "metrics", config, upstream["env"]) as instance:
        instance["metrics_port"] = metrics_port
        instance["metrics_url"] = f"http://127.0.0.1:{metrics_port}/metrics"
        yield instance


class Prometheus:
    """Debian's Prometheus on a loopback port, scraping `target` (host:port) every second."""

    def __init__(self, directory, target):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = directory / "prometheus.yml"
        # JSON is YAML: the configuration Prometheus reads.
        config.write_text(json.dumps({
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": "gatehouse", "metrics_path": "/metrics",
                                "static_configs": [{"targets": [target]}]}],
        }))
        self.log = open(directory / "prometheus.log", "w")
        self.process = subprocess.Popen(
            ["/usr/bin/prometheus", f"--config.file={config}", f"--storage.tsdb.path={directory / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1h"],
            stdout=self.log, stderr=subprocess.STDOUT)
        poll(self.ready, 30, "Prometheus ready")

    def ready(self):
        if self.process.poll() is not None:
            raise RuntimeError(f"prometheus exited with status {self.process.returncode}")
        try:
            return requests.get(self.url + "/-/ready", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def query(self, expression):
        """The instant vector of `expression`: [(labels dict, float)]."""
        answer = requests.get(self.url + "/api/v1/query", params={"query": expression}, timeout=5)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["status"] == "success", body
        return [(item["metric"], float(item["value"][1])) for item in body["data"]["result"]]

    def value(self, expression):
        """The one value of a `sum(...)`-style expression; None while the series does not exist."""
        result = self.query(expression)
        return result[0][1] if result else None

    def target_health(self):
        answer = requests.get(self.url + "/api/v1/targets", timeout=5).json()
        return [(t["scrapeUrl"], t["health"], t.get("lastError")) for t in answer["data"]["activeTargets"]]

    def stop(self):
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        self.log.close()


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory, metered):
    server = Prometheus(tmp_path_factory.mktemp("prometheus"), f"127.0.0.1:{metered['metrics_port']}")
    yield server
    server.stop()


def bearer(token):
    return {"Authorization": f"Bearer {token}"}


def test_prometheus_scrapes_request_upstream_refresh_cache_and_relay_series(metered, prometheus, identity, seen):
    base = metered["url"]
    # A sign-in: the token endpoint, one code exchange at the upstream.
    app, tokens = relay_sign_in(base, seen)
    # A refresh: one refresh grant at the upstream (passthrough: performed by Gatehouse).
    refreshed = app.refresh(tokens["refresh_token"])
    assert refreshed.status_code == 200, refreshed.text

    # Relayed calls: one identity-cache miss (general path), then hits: GETs on the fast path,
    # POSTs with a body on the general path.
    relay_token = "ops-" + secrets.token_urlsafe(32)
    seen.add(relay_token, kind="relayed access token (metrics test)")
    identity.register(relay_token, "alice")
    with requests.Session() as session:
        first = session.get(base + "/api/ops/first", headers=bearer(relay_token), timeout=10)
        assert first.status_code == 200, first.text
        assert served_by(metered["lines"], first) == "general"
        for index in range(FAST_GETS):
            answer = session.get(base + f"/api/ops/item/{index}", headers=bearer(relay_token), timeout=10)
            assert answer.status_code == 200, answer.text
            assert served_by(metered["lines"], answer) == "fast"
        for index in range(GENERAL_POSTS):
            # A chunked body (a generator) always goes the general way; a small sized one may not (issue 12).
            answer = session.post(base + f"/api/ops/post/{index}", data=iter([b"x" * 100]), headers=bearer(relay_token), timeout=10)
            assert answer.status_code == 200, answer.text
            assert served_by(metered["lines"], answer) == "general"
    assert identity.known_calls == 1

    hits = FAST_GETS + GENERAL_POSTS
    expected = {
        'sum(gatehouse_http_requests_total{route="/oauth/token"})': 2,
        'sum(gatehouse_http_requests_total{route="/oauth/token",status_class="2xx",method="POST"})': 2,
        'sum(gatehouse_http_request_duration_seconds_count{route="/oauth/token"})': 2,
        f'sum(gatehouse_http_requests_total{{route="{ROUTE}",status_class="2xx"}})': 1 + hits,
        'sum(gatehouse_upstream_requests_total{upstream="legacy",endpoint="token",outcome="ok"})': 1,
        'sum(gatehouse_upstream_requests_total{upstream="legacy",endpoint="refresh",outcome="ok"})': 1,
        'sum(gatehouse_upstream_request_duration_seconds_count{upstream="legacy",endpoint="token"})': 1,
        'sum(gatehouse_upstream_requests_total{upstream="legacy",endpoint="identity",outcome="ok"})': 1,
        'sum(gatehouse_refreshes_total{outcome="performed"})': 1,
        'sum(gatehouse_identity_cache_lookups_total{result="miss"})': 1,
        'sum(gatehouse_identity_cache_lookups_total{result="hit"})': hits,
        f'sum(gatehouse_relay_requests_total{{route="{ROUTE}",path="fast"}})': FAST_GETS,
        f'sum(gatehouse_relay_requests_total{{route="{ROUTE}",path="general"}})': 1 + GENERAL_POSTS,
    }

    def observed():
        return {expression: prometheus.value(expression) for expression in expected}

    try:
        poll(lambda: observed() == expected, 20, "Prometheus shows the expected counts", interval=0.25)
    except AssertionError:
        table = "\n".join(f"  {expression}: expected {want}, Prometheus has {got}"
                          for (expression, want), got in zip(expected.items(), observed().values()))
        raise AssertionError(f"Prometheus's counts differ (targets: {prometheus.target_health()}):\n{table}") from None
    # The refreshes that did not happen are not invented.
    assert (prometheus.value('sum(gatehouse_refreshes_total{outcome="failed"})') or 0) == 0
    # The target is up: Prometheus parsed every scrape.
    assert prometheus.value('up{job="gatehouse"}') == 1


def test_promtool_accepts_the_exposition(metered):
    exposition = scrape(metered["metrics_url"])
    assert "gatehouse_http_requests_total" in exposition
    check = subprocess.run(["/usr/bin/promtool", "check", "metrics"], input=exposition, capture_output=True, text=True,
                           timeout=30)
    assert check.returncode == 0, f"promtool check metrics: {check.stdout}{check.stderr}"
    # The histogram buckets of the contract.
    samples = parse_exposition(exposition)
    buckets = {dict(labels)["le"] for (name, labels) in samples if name == "gatehouse_http_request_duration_seconds_bucket"}
    assert {"0.001", "0.005", "0.1", "1.0", "10.0", "+Inf"} <= {_le(b) for b in buckets}, sorted(buckets)


def _le(text):
    return "+Inf" if text == "+Inf" else repr(float(text))


def test_route_labels_are_templates_never_raw_paths(metered):
    marker = "raw-" + secrets.token_hex(8)
    assert requests.get(metered["url"] + f"/api/raw/{marker}/x?q={marker}", timeout=10).status_code == 401  # no token
    assert requests.get(metered["url"] + f"/{marker}", timeout=10).status_code == 404

    def has_both():
        samples = parse_exposition(scrape(metered["metrics_url"]))
        return (metric_sum(samples, "gatehouse_http_requests_total", route="/api/raw/*", status_class="4xx") >= 1
                and metric_sum(samples, "gatehouse_http_requests_total", route="unmatched", status_class="4xx") >= 1)

    poll(has_both, 10, "the relayed route's template and `unmatched` in the exposition")
    exposition = scrape(metered["metrics_url"])
    assert marker not in exposition
    routes = {dict(labels).get("route") for (name, labels) in parse_exposition(exposition)
              if name == "gatehouse_http_requests_total"}
    assert all(route == "unmatched" or route.startswith("/") and "?" not in route for route in routes), routes


def test_no_token_or_secret_in_the_exposition(metered, seen, upstream):
    exposition = scrape(metered["metrics_url"])
    seen.harvest()
    assert seen.find(exposition) == []
    for secret in upstream["env"]["UPSTREAM_SECRET_LEGACY"], upstream["env"]["UPSTREAM_SECRET_MODERN"]:
        assert secret not in exposition


def test_metrics_listener_serves_metrics_only_and_the_public_port_has_none(metered):
    assert requests.get(metered["url"] + "/metrics", timeout=5).status_code == 404
    listener = f"http://127.0.0.1:{metered['metrics_port']}"
    assert requests.get(listener + "/metrics", timeout=5).status_code == 200
    assert requests.get(listener + "/healthz", timeout=5).status_code == 404
    assert requests.post(listener + "/oauth/token", data={"grant_type": "x"}, timeout=5).status_code in (404, 405)


@pytest.mark.parametrize("allow, status", [(["127.0.0.1", "'::1'"], 200), (["10.0.0.0/8"], 404)],
                         ids=["loopback-allowed", "only-10.0.0.0/8"])
def test_metrics_on_the_public_port_only_for_allowed_addresses(workdir, upstream, relay_doubles, seen, identity, allow, status):
    port = free_port()
    name = "metrics-allow-" + ("loopback" if status == 200 else "ten")
    config = gateway_config(port, workdir, name, upstream["url"], identity.url_for_config, relay_doubles["backend"].url,
                            seen, sections=metrics_section(allow=allow))
    with gateway(workdir, name, config, upstream["env"]) as instance:
        assert requests.get(instance["url"] + "/healthz", timeout=5).status_code == 200
        answer = requests.get(instance["url"] + "/metrics", timeout=5)
        assert answer.status_code == status, answer.text[:300]
        if status == 200:
            assert answer.headers["Content-Type"].startswith("text/plain")
            assert "gatehouse_http_requests_total" in answer.text
            # Forwarded by a proxy (maybe from the internet): not the allowed address asking.
            # Every forwarding header a proxy or CDN writes, not only the standard ones.
            for header in ("X-Forwarded-For", "Forwarded", "X-Real-IP", "True-Client-IP", "CF-Connecting-IP", "X-Client-IP",
                           "Via", "Fastly-Client-IP", "X-Cluster-Client-IP"):
                forwarded = requests.get(instance["url"] + "/metrics", timeout=5, headers={header: "127.0.0.1"})
                assert forwarded.status_code == 404 and "gatehouse_" not in forwarded.text, header
        else:
            assert "gatehouse_" not in answer.text
