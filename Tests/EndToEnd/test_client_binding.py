"""What Gatehouse hands to one app is bound to that app, and a sign-in to its wiring: another
app on the same upstream, with the same redirect URIs, can redeem, refresh or revoke none of
it (RFC 6749 §4.1.3, §6 and §10.4; RFC 7009 §2.1), and a state shown to the other wiring's
endpoint is refused without being consumed.

The pairs of apps (conftest): com.example.app and com.example.app2 (passthrough: they hold the
upstream's tokens), com.example.sealed and com.example.sealed2 (sealed: they hold Gatehouse's),
all four on the upstream "legacy", with the same redirect URIs.
"""

import pytest
import requests

from sandbox.nativeapp import APP_REDIRECT, App, InAppBrowser, query

PAIRS = {"passthrough": ("com.example.app", "com.example.app2"), "sealed": ("com.example.sealed", "com.example.sealed2")}

#: A route of the upstream "legacy" for each kind of token: a passthrough app's access token is
#: the upstream's; a sealed app's is Gatehouse's, swapped for the session's upstream token.
ROUTES = {"passthrough": "/api/contracts/x", "sealed": "/api/sealed/x"}


def signed_in(gatehouse, seen, client_id):
    app = App(gatehouse, seen, client_id=client_id)
    answer = app.redeem(app.sign_in()["code"])
    assert answer.status_code == 200, answer.text
    return app, answer.json()


def relay(gatehouse, path, token):
    return requests.get(gatehouse["url"] + path, headers={"Authorization": f"Bearer {token}"}, timeout=30)


def invalid_grant(answer):
    return (answer.status_code, answer.json().get("error"), "access_token" in answer.json())


def introspect(upstream, token):
    return requests.post(upstream["url"] + "/o/introspect/", data={"token": token}, timeout=10,
                         auth=("gatehouse-legacy", upstream["env"]["UPSTREAM_SECRET_LEGACY"])).json()


@pytest.mark.parametrize("exposure", ["passthrough", "sealed"])
def test_a_code_redeemed_by_another_app_is_invalid_grant_and_burnt(gatehouse, seen, exposure):
    owner, other = PAIRS[exposure]
    app = App(gatehouse, seen, client_id=owner)
    code = app.sign_in()["code"]
    # Everything right but the client: the same redirect URI, even the owner's own verifier.
    stolen = App(gatehouse, seen, client_id=other).redeem(code, verifier=app.verifier)
    assert invalid_grant(stolen) == (400, "invalid_grant", False)
    # The attempt burnt the code (RFC 6749 §4.1.2: a code is used once, whoever shows it).
    assert invalid_grant(app.redeem(code)) == (400, "invalid_grant", False)


@pytest.mark.parametrize("exposure", ["sealed", "passthrough"])
def test_a_refresh_token_shown_by_another_app_is_invalid_grant_and_still_works_for_its_own(gatehouse, seen, exposure):
    owner, other = PAIRS[exposure]
    app, pair = signed_in(gatehouse, seen, owner)
    if exposure == "sealed":
        assert pair["refresh_token"].startswith("ghr_")
    else:
        assert not pair["refresh_token"].startswith("ghr_")  # the upstream's own refresh token
    refused = App(gatehouse, seen, client_id=other).refresh(pair["refresh_token"])
    assert invalid_grant(refused) == (400, "invalid_grant", False)
    # The refused attempt spent nothing: not Gatehouse's token, not the upstream's.
    own = app.refresh(pair["refresh_token"])
    assert own.status_code == 200, own.text
    assert own.json()["refresh_token"] != pair["refresh_token"]
    assert relay(gatehouse, ROUTES[exposure], own.json()["access_token"]).status_code == 200


@pytest.mark.parametrize("owner, other", [("com.example.sealed", "com.example.app"), ("com.example.app", "com.example.sealed")],
                         ids=["sealed-token-to-passthrough-app", "passthrough-token-to-sealed-app"])
def test_a_refresh_token_shown_by_an_app_of_the_other_exposure_is_invalid_grant(gatehouse, seen, owner, other):
    app, pair = signed_in(gatehouse, seen, owner)
    refused = App(gatehouse, seen, client_id=other).refresh(pair["refresh_token"])
    assert invalid_grant(refused) == (400, "invalid_grant", False)
    # A Gatehouse refresh token never leaves Gatehouse: none was ever posted to an upstream.
    seen.harvest()
    assert not [token for token in seen.recorded("refresh token presented to the upstream") if token.startswith("ghr_")]
    own = app.refresh(pair["refresh_token"])
    assert own.status_code == 200, own.text


@pytest.mark.parametrize("presented", ["access_token", "refresh_token"])
@pytest.mark.parametrize("exposure", ["sealed", "passthrough"])
def test_another_app_revoking_a_token_gets_200_and_changes_nothing(gatehouse, seen, upstream, exposure, presented):
    """RFC 7009 §2.1: the server checks that the token was issued to the client asking for its
    revocation; for another client's token it answers as for an unknown one (§2.2: 200)."""
    owner, other = PAIRS[exposure]
    app, pair = signed_in(gatehouse, seen, owner)
    revoked = requests.post(gatehouse["url"] + "/oauth/revoke", timeout=10,
                            data={"token": pair[presented], "client_id": other, "token_type_hint": presented})
    assert revoked.status_code == 200, revoked.text
    # The owner's access token still works through the relay (a fresh identity lookup: nothing
    # was cached for it before), and at the upstream itself.
    relayed = relay(gatehouse, ROUTES[exposure], pair["access_token"])
    assert relayed.status_code == 200, relayed.text
    upstream_token = relayed.json()["headers"]["authorization"].removeprefix("Bearer ") if exposure == "sealed" else pair["access_token"]
    assert introspect(upstream, upstream_token)["active"] is True
    # And so does its refresh token.
    own = app.refresh(pair["refresh_token"])
    assert own.status_code == 200, own.text


@pytest.mark.parametrize("exposure", ["sealed", "passthrough"])
def test_the_owner_revoking_its_token_ends_it(gatehouse, seen, upstream, exposure):
    """The control of the test above: the same request from the owner does revoke."""
    owner, _ = PAIRS[exposure]
    app, pair = signed_in(gatehouse, seen, owner)
    revoked = requests.post(gatehouse["url"] + "/oauth/revoke", timeout=10,
                            data={"token": pair["refresh_token"], "client_id": owner, "token_type_hint": "refresh_token"})
    assert revoked.status_code == 200, revoked.text
    assert invalid_grant(app.refresh(pair["refresh_token"])) == (400, "invalid_grant", False)
    assert relay(gatehouse, ROUTES[exposure], pair["access_token"]).status_code == 401


def test_a_relay_mode_state_shown_to_the_callback_is_refused_and_not_consumed(gatehouse, seen):
    app = App(gatehouse, seen, client_id="com.example.relay")
    received = app.sign_in()  # relay mode: the upstream's code and Gatehouse's state, straight to the app
    assert received["state"] != app.state
    for accept, content_type in [("text/html", "text/html"), ("application/json", "application/problem+json")]:
        shown = requests.get(gatehouse["url"] + "/oauth/callback", params={"code": received["code"], "state": received["state"]},
                             headers={"Accept": accept}, allow_redirects=False, timeout=10)
        assert shown.status_code == 400
        assert "Location" not in shown.headers
        assert shown.headers["Content-Type"].startswith(content_type)
    assert shown.json()["code"] == "unknown_state"
    # Neither the transaction nor the upstream's code was used: the app's own redemption works.
    tokens = app.redeem(received["code"], state=received["state"])
    assert tokens.status_code == 200, tokens.text
    assert tokens.json()["access_token"]


def test_a_callback_mode_state_posted_to_the_token_endpoint_is_invalid_grant_and_not_consumed(gatehouse, seen):
    app = App(gatehouse, seen)  # com.example.app: callback wiring
    browser = InAppBrowser(seen=seen)
    callback = gatehouse["url"] + "/oauth/callback"
    to_callback = browser.follow(app.authorize_url(), callback)  # the browser stops before Gatehouse's callback
    assert isinstance(to_callback, str) and to_callback.startswith(callback)
    sent = query(to_callback)
    # A relay app posts the upstream's code with that callback-mode state, and the verifier
    # that matches the transaction's challenge: only the wiring is wrong.
    relay_app = App(gatehouse, seen, client_id="com.example.relay")
    attempt = relay_app.redeem(sent["code"], verifier=app.verifier, state=sent["state"])
    assert invalid_grant(attempt) == (400, "invalid_grant", False)
    # Nothing was consumed: the sign-in goes on at the callback, and the app gets its tokens.
    finished = browser.session.get(to_callback, allow_redirects=False, timeout=30)
    assert finished.status_code == 302, finished.text
    assert finished.headers["Location"].startswith(APP_REDIRECT)
    received = query(finished.headers["Location"])
    assert received["state"] == app.state and "code" in received, received.keys()
    seen.add(received["code"], kind="Gatehouse code")
    tokens = app.redeem(received["code"])
    assert tokens.status_code == 200, tokens.text
