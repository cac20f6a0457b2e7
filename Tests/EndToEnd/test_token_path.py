"""The myVOO token path, end to end: a native app signs in through Gatehouse to a real
OAuth server that demands a client secret and burns each refresh token after one use."""

import threading
from concurrent.futures import ThreadPoolExecutor

import requests

from sandbox.nativeapp import APP_REDIRECT, App, InAppBrowser, query


def test_discovery_names_gatehouse_as_issuer(gatehouse):
    document = requests.get(f"{gatehouse['url']}/.well-known/oauth-authorization-server", timeout=5).json()
    assert document["issuer"] == gatehouse["url"]
    assert document["authorization_endpoint"] == gatehouse["url"] + "/oauth/authorize"
    assert document["code_challenge_methods_supported"] == ["S256"]


def spent_at_the_upstream(upstream, refresh_token):
    """The upstream's own answer to `refresh_token` (Gatehouse's registration, as Gatehouse would ask)."""
    answer = requests.post(upstream["url"] + "/o/token/", data={"grant_type": "refresh_token", "refresh_token": refresh_token},
                           auth=("gatehouse-legacy", upstream["env"]["UPSTREAM_SECRET_LEGACY"]), timeout=10)
    return answer.status_code, answer.json().get("error")


def test_callback_mode_signs_in_refreshes_twice_and_a_spent_refresh_token_only_replays_its_answer(gatehouse, seen, upstream):
    app = App(gatehouse, seen)
    received = app.sign_in()
    assert received["state"] == app.state
    assert received["iss"] == gatehouse["url"]

    tokens = app.redeem(received["code"])
    assert tokens.status_code == 200, tokens.text
    assert tokens.headers["Cache-Control"] == "no-store"
    first = tokens.json()
    assert first["access_token"] and first["refresh_token"]

    second = app.refresh(first["refresh_token"])
    assert second.status_code == 200, second.text
    third = app.refresh(second.json()["refresh_token"])
    assert third.status_code == 200, third.text
    assert third.json()["access_token"] != first["access_token"]

    # The upstream burnt the first refresh token; Gatehouse answers a replay within its grace
    # window (30 s) with the pair that token was answered with, and asks the upstream nothing.
    assert spent_at_the_upstream(upstream, first["refresh_token"]) == (400, "invalid_grant")
    replay = app.refresh(first["refresh_token"])
    assert replay.status_code == 200, replay.text
    assert (replay.json()["access_token"], replay.json()["refresh_token"]) == \
        (second.json()["access_token"], second.json()["refresh_token"])


def test_relay_mode_app_posts_upstream_code_with_state_and_verifier(gatehouse, seen, upstream):
    app = App(gatehouse, seen, client_id="com.example.relay")
    received = app.sign_in()
    # The upstream sent the browser straight to the app, with Gatehouse's state.
    assert received["state"] != app.state
    tokens = app.redeem(received["code"], state=received["state"])
    assert tokens.status_code == 200, tokens.text
    refreshed = app.refresh(tokens.json()["refresh_token"])
    assert refreshed.status_code == 200, refreshed.text
    assert spent_at_the_upstream(upstream, tokens.json()["refresh_token"]) == (400, "invalid_grant")
    replay = app.refresh(tokens.json()["refresh_token"])  # within the grace window: the same pair
    assert replay.status_code == 200 and replay.json()["refresh_token"] == refreshed.json()["refresh_token"]


def test_relay_mode_wrong_verifier_never_reaches_the_upstream_and_burns_the_state(gatehouse, seen):
    app = App(gatehouse, seen, client_id="com.example.relay")
    received = app.sign_in()
    wrong = app.redeem(received["code"], verifier="x" * 43, state=received["state"])
    assert wrong.status_code == 400 and wrong.json()["error"] == "invalid_grant"
    again = app.redeem(received["code"], state=received["state"])
    assert again.json()["error"] == "invalid_grant"


def test_upstream_with_pkce_and_client_secret_post(gatehouse, seen):
    app = App(gatehouse, seen, client_id="com.example.modern")
    tokens = app.redeem(app.sign_in()["code"])
    assert tokens.status_code == 200, tokens.text
    assert app.refresh(tokens.json()["refresh_token"]).status_code == 200


def test_wrong_verifier_is_invalid_grant(gatehouse, seen):
    app = App(gatehouse, seen)
    response = app.redeem(app.sign_in()["code"], verifier="W" * 43)
    assert response.status_code == 400
    assert response.json()["error"] == "invalid_grant"


def test_missing_verifier_is_invalid_request(gatehouse, seen):
    app = App(gatehouse, seen)
    response = app.redeem(app.sign_in()["code"], verifier=None)
    assert response.status_code == 400
    assert response.json()["error"] == "invalid_request"


def test_method_plain_is_sent_back_to_the_app(gatehouse, seen):
    app = App(gatehouse, seen)
    response = requests.get(app.authorize_url(code_challenge_method="plain", code_challenge=app.verifier),
                            allow_redirects=False, timeout=5)
    assert response.status_code == 302
    received = query(response.headers["Location"])
    assert response.headers["Location"].startswith(APP_REDIRECT)
    assert received["error"] == "invalid_request"
    assert received["state"] == app.state


def test_gatehouse_code_used_twice_fails_the_second_time(gatehouse, seen):
    app = App(gatehouse, seen)
    code = app.sign_in()["code"]
    assert app.redeem(code).status_code == 200
    again = app.redeem(code)
    assert again.status_code == 400 and again.json()["error"] == "invalid_grant"


def test_gatehouse_code_used_concurrently_has_exactly_one_winner(gatehouse, seen):
    app = App(gatehouse, seen)
    code = app.sign_in()["code"]
    barrier = threading.Barrier(8)

    def redeem(_):
        barrier.wait(timeout=30)  # all eight leave together
        return app.redeem(code)

    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(redeem, range(8)))
    winners = [answer for answer in answers if answer.status_code == 200]
    losers = [answer for answer in answers if answer.status_code != 200]
    assert len(winners) == 1, [answer.status_code for answer in answers]
    tokens = winners[0].json()
    assert tokens["access_token"] and tokens["refresh_token"] and tokens["token_type"].lower() == "bearer"
    assert winners[0].headers["Cache-Control"] == "no-store"
    assert [(answer.status_code, answer.json()["error"]) for answer in losers] == [(400, "invalid_grant")] * 7
    # The winner's tokens are real: its refresh token works at the upstream through Gatehouse.
    assert app.refresh(tokens["refresh_token"]).status_code == 200


def test_state_reused_at_the_callback_is_refused(gatehouse, seen):
    app = App(gatehouse, seen)
    browser = InAppBrowser()
    first = browser.session.get(app.authorize_url(), allow_redirects=False, timeout=5)
    upstream_authorize = first.headers["Location"]
    to_callback = browser.follow(upstream_authorize, gatehouse["url"] + "/oauth/callback")
    assert isinstance(to_callback, str)
    assert requests.get(to_callback, allow_redirects=False, timeout=10).status_code == 302
    replay = requests.get(to_callback, allow_redirects=False, timeout=10)
    assert replay.status_code == 400
    assert "Location" not in replay.headers
    assert replay.json()["code"] == "unknown_state"


def test_unknown_client_gets_an_error_page_not_a_redirect(gatehouse, seen):
    app = App(gatehouse, seen, client_id="com.example.unknown")
    response = requests.get(app.authorize_url(), allow_redirects=False, timeout=5, headers={"Accept": "text/html"})
    assert response.status_code == 400
    assert "Location" not in response.headers
    assert response.headers["Content-Type"].startswith("text/html")


import pytest


@pytest.mark.parametrize("redirect", [
    APP_REDIRECT + "/",                 # trailing slash
    "com.example.app:/OAuth2Redirect",  # case
    APP_REDIRECT + "?extra=1",          # added query
    APP_REDIRECT + "#fragment",         # fragment
])
def test_redirect_uri_that_differs_is_refused_without_redirect(gatehouse, seen, redirect):
    app = App(gatehouse, seen, redirect_uri=redirect)
    response = requests.get(app.authorize_url(), allow_redirects=False, timeout=5)
    assert response.status_code == 400
    assert "Location" not in response.headers
    assert response.json()["code"] == "invalid_redirect_uri"


def test_loopback_redirect_matches_any_port(gatehouse, seen):
    app = App(gatehouse, seen, redirect_uri="http://127.0.0.1:53187/callback")
    response = requests.get(app.authorize_url(), allow_redirects=False, timeout=5)
    assert response.status_code == 302
    assert "/o/authorize/" in response.headers["Location"]
