"""What the app sees when the upstream is down, slow or talking nonsense."""

import requests

from sandbox.nativeapp import App


def test_upstream_down_is_503_with_retry_after(gatehouse, seen):
    response = App(gatehouse, seen, client_id="com.example.down").refresh("any-refresh-token")
    assert response.status_code == 503
    assert response.json()["error"] == "temporarily_unavailable"
    assert int(response.headers["Retry-After"]) > 0


def test_a_refresh_slower_than_the_upstreams_timeout_is_503_outcome_unknown(gatehouse, seen):
    # The request may have reached the upstream: with refresh_token_policy single_use it is not
    # retried, and the app is told to try again (503 + Retry-After), not that its grant is dead.
    response = App(gatehouse, seen, client_id="com.example.slow").refresh("any-refresh-token")
    assert response.status_code == 503
    assert response.json()["error"] == "temporarily_unavailable"
    assert int(response.headers["Retry-After"]) > 0


def test_a_refresh_that_failed_does_not_bind_an_unknown_token_to_the_app(gatehouse, seen):
    # A token Gatehouse never handed out is bound to an app only by a refresh that succeeded:
    # after com.example.down failed with it, another app presenting it still reaches its upstream.
    token = "never-issued-" + "x" * 20
    assert App(gatehouse, seen, client_id="com.example.down").refresh(token).status_code == 503
    response = App(gatehouse, seen, client_id="com.example.garbage").refresh(token)
    assert response.status_code == 502, response.text


def test_upstream_answering_invalid_json_is_502(gatehouse, seen):
    response = App(gatehouse, seen, client_id="com.example.garbage").refresh("any-refresh-token")
    assert response.status_code == 502
    assert response.json()["error"] == "server_error"


def test_upstream_refusing_a_refresh_token_is_invalid_grant(gatehouse, seen):
    response = App(gatehouse, seen).refresh("not-a-real-refresh-token")
    assert response.status_code == 400
    assert response.json()["error"] == "invalid_grant"


def test_malformed_token_bodies_are_400_never_5xx(gatehouse):
    url = f"{gatehouse['url']}/oauth/token"
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    for body in [b"grant_type=refresh_token&grant_type=x", b"client_id=%FF%FE", b"a=%zz", b"\xff\xfe=1", b"&&&="]:
        response = requests.post(url, data=body, headers=headers, timeout=5)
        assert response.status_code == 400, (body, response.status_code, response.text)
    assert requests.post(url, data=b"x=" + b"a" * 100_000, headers=headers, timeout=5).status_code == 413
