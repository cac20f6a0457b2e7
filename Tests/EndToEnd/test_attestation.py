"""Attestation end to end: app instances certify themselves with Apple App Attest and Google Play
Integrity statements built as devices build them (Tests/Support/attestation.py: cbor2 +
cryptography, from the published formats), against a test root standing in for Apple's and test
keys standing in for the Play Console's. Every check fails on its own; with `attestation:
required`, only a certified instance gets tokens."""

import http.client
import json
import socket
import threading
import time
from urllib.parse import urlencode, urlsplit

import pytest
import requests

from attestation import (DEVELOPMENT, AppleAuthority, DeviceKey, PlayKeys, assertion, attest, integrity_token, verdict)
from sandbox.nativeapp import APP_REDIRECT, App
from trusted import trusted_gatehouse

APP = "com.example.attested"
APP_ID = "ABCDE12345.com.example.attested"
PACKAGE = "com.example.attested"


@pytest.fixture(scope="module")
def authority():
    return AppleAuthority()


@pytest.fixture(scope="module")
def play():
    return PlayKeys()


@pytest.fixture(scope="module")
def gatehouse(workdir, seen, authority, play):
    root = authority.write_root(workdir / "attestation-root.pem")
    decryption, verification = play.write(workdir, "play")
    seen.add(decryption.read_text().strip(), kind="code or token")
    clients = f"""
  - client_id: {APP}
    upstream: legacy
    scopes: [read, write]
    redirect_uris: ["{APP_REDIRECT}"]
    instances:
      attestation: required
      apple:
        app_id: {APP_ID}
        root_ca_file: {root}
      play:
        package_name: {PACKAGE}
        decryption_key_file: {decryption}
        verification_key_file: {verification}
        device_recognition: MEETS_DEVICE_INTEGRITY
        max_age: 2m"""
    with trusted_gatehouse(workdir, seen, "attestation", clients) as running:
        yield running


def instance(gatehouse):
    answer = requests.post(gatehouse["url"] + "/oauth/register", json={"software_id": APP}, timeout=10)
    assert answer.status_code == 201, answer.text
    return answer.json()["client_id"]


def challenge(gatehouse, client_id):
    answer = requests.post(gatehouse["url"] + "/oauth/attestation/challenge", data={"client_id": client_id}, timeout=10)
    assert answer.status_code == 200, answer.text
    return answer.json()["challenge"]


def send(gatehouse, client_id, nonce, **statement):
    return requests.post(gatehouse["url"] + "/oauth/attestation", data={"client_id": client_id, "challenge": nonce, **statement},
                         timeout=10)


def apple(gatehouse, authority, client_id, key=None, **options):
    key = key or DeviceKey()
    nonce = challenge(gatehouse, client_id)
    key_id, obj = attest(authority, key, options.pop("challenge", nonce), options.pop("app_id", APP_ID), **options)
    return send(gatehouse, client_id, nonce, type="apple", key_id=key_id, attestation_object=obj), key


def refused(answer, words):
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"] == "invalid_attestation", answer.text
    assert words in answer.json()["error_description"], answer.json()["error_description"]


def test_an_uncertified_instance_gets_no_tokens_and_a_certified_one_does(gatehouse, seen, authority):
    client_id = instance(gatehouse)
    app = App(gatehouse, seen, client_id=client_id)
    assert app.redeem("whatever").json()["error"] == "unauthorized_client"
    answer, _ = apple(gatehouse, authority, client_id)
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"client_id": client_id, "certified": True, "method": "apple"}
    app = App(gatehouse, seen, client_id=client_id)
    tokens = app.redeem(app.sign_in()["code"])
    assert tokens.status_code == 200, tokens.text


def test_a_challenge_is_single_use_and_another_instances_is_refused(gatehouse, authority):
    client_id = instance(gatehouse)
    key = DeviceKey()
    nonce = challenge(gatehouse, client_id)
    key_id, obj = attest(authority, key, nonce, APP_ID)
    assert send(gatehouse, client_id, nonce, type="apple", key_id=key_id, attestation_object=obj).status_code == 200
    refused(send(gatehouse, client_id, nonce, type="apple", key_id=key_id, attestation_object=obj), "challenge")
    other = instance(gatehouse)
    theirs = challenge(gatehouse, other)
    key_id, obj = attest(authority, DeviceKey(), theirs, APP_ID)
    refused(send(gatehouse, client_id, theirs, type="apple", key_id=key_id, attestation_object=obj), "challenge")


@pytest.mark.parametrize("case, words", [
    ("wrong nonce", "nonce"), ("attested another challenge", "nonce"), ("wrong RP id", "RP id"),
    ("another root", "root"), ("wrong key id", "key id"), ("non-zero counter", "counter"), ("development aaguid", "aaguid"),
])
def test_each_app_attest_check_fails_on_its_own(gatehouse, authority, case, words):
    client_id = instance(gatehouse)
    options = {
        "wrong nonce": {"nonce": b"\x00" * 32},
        "attested another challenge": {"challenge": "another challenge"},
        "wrong RP id": {"app_id": "ZZZZZ99999.com.example.other"},
        "wrong key id": {"key_id": b"\x01" * 32},
        "non-zero counter": {"counter": 1},
        "development aaguid": {"aaguid": DEVELOPMENT},
    }.get(case, {})
    if case == "another root":
        answer, _ = apple(gatehouse, AppleAuthority("Another Root"), client_id)
    else:
        answer, _ = apple(gatehouse, authority, client_id, **options)
    refused(answer, words)
    assert App(gatehouse, None, client_id=client_id).redeem("x").json()["error"] == "unauthorized_client"


def test_an_assertion_recertifies_only_with_a_growing_counter(gatehouse, authority):
    client_id = instance(gatehouse)
    answer, key = apple(gatehouse, authority, client_id)
    assert answer.status_code == 200
    nonce = challenge(gatehouse, client_id)
    assert send(gatehouse, client_id, nonce, type="apple_assertion", assertion=assertion(key, nonce, APP_ID, 1)).status_code == 200
    nonce = challenge(gatehouse, client_id)
    refused(send(gatehouse, client_id, nonce, type="apple_assertion", assertion=assertion(key, nonce, APP_ID, 1)), "counter")
    nonce = challenge(gatehouse, client_id)
    refused(send(gatehouse, client_id, nonce, type="apple_assertion", assertion=assertion(DeviceKey(), nonce, APP_ID, 5)), "signature")
    nonce = challenge(gatehouse, client_id)
    refused(send(gatehouse, client_id, nonce, type="apple_assertion", assertion=assertion(key, "other", APP_ID, 6)), "signature")
    nonce = challenge(gatehouse, client_id)
    assert send(gatehouse, client_id, nonce, type="apple_assertion", assertion=assertion(key, nonce, APP_ID, 7)).status_code == 200
    # An instance with no attested key has nothing to assert with.
    fresh = instance(gatehouse)
    nonce = challenge(gatehouse, fresh)
    refused(send(gatehouse, fresh, nonce, type="apple_assertion", assertion=assertion(key, nonce, APP_ID, 9)), "no attested")


#: What the store's compare-and-set of the counter answers the loser of a race: both assertions
#: passed the verification's own check against the same stored counter.
REPLAY = "counter did not increase (a replay)"


def held_request(url, form):
    """`form` POSTed to `url` on a connection of its own but for its last byte (the server cannot
    start on it before it has that byte): the socket and the byte."""
    parts = urlsplit(url)
    body = urlencode(form).encode()
    head = (f"POST {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/x-www-form-urlencoded\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    connection = socket.create_connection((parts.hostname, parts.port), timeout=10)
    connection.sendall(head + body[:-1])
    return connection, body[-1:]


def test_two_assertions_racing_with_one_counter_certify_once(gatehouse, authority):
    # The counter is a compare-and-set in the store: of two assertions with the same counter sent
    # at once (each with its own challenge), exactly one passes, and the other is refused as a
    # replay by the compare-and-set, both having passed the check against the counter they read.
    # Both requests are sent but for their last byte, then the last bytes behind a barrier. Two
    # requests served in turn also end 200 and 400, the second refused by that check instead
    # ("not valid: the counter did not increase"): such a round proves nothing and is run again,
    # 10 rounds at most, until one shows the replay.
    client_id = instance(gatehouse)
    answer, key = apple(gatehouse, authority, client_id)
    assert answer.status_code == 200
    refusals = []
    for round_ in range(10):
        counter = 10 + round_
        held = []
        for _ in range(2):
            nonce = challenge(gatehouse, client_id)
            held.append(held_request(gatehouse["url"] + "/oauth/attestation", {
                "client_id": client_id, "challenge": nonce, "type": "apple_assertion",
                "assertion": assertion(key, nonce, APP_ID, counter)}))
        barrier = threading.Barrier(2)
        results = [None, None]

        def race(index):
            connection, last = held[index]
            with connection:
                barrier.wait(10)
                connection.sendall(last)
                response = http.client.HTTPResponse(connection)
                response.begin()
                results[index] = (response.status, json.loads(response.read()))

        threads = [threading.Thread(target=race, args=(index,)) for index in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(20)
        assert sorted(status for status, _ in results) == [200, 400], results
        loser = next(body for status, body in results if status == 400)
        assert loser["error"] == "invalid_attestation", loser
        refusals.append(loser["error_description"])
        if REPLAY in loser["error_description"]:
            break
    assert REPLAY in refusals[-1], f"no round raced: {refusals}"
    print(f"the loser was refused as a replay in round {len(refusals)}: {refusals}")


def test_a_play_integrity_verdict_certifies(gatehouse, seen, play):
    client_id = instance(gatehouse)
    nonce = challenge(gatehouse, client_id)
    answer = send(gatehouse, client_id, nonce, type="play", integrity_token=integrity_token(play, verdict(nonce, PACKAGE)))
    assert answer.status_code == 200, answer.text
    assert answer.json()["method"] == "play"
    app = App(gatehouse, seen, client_id=client_id)
    assert app.redeem(app.sign_in()["code"]).status_code == 200


@pytest.mark.parametrize("case, words", [
    ("wrong package", "requestPackageName"), ("unrecognized version", "not recognized"), ("stale", "too old"),
    ("bad signature", "signature"), ("nonce mismatch", "nonce"), ("weak device", "MEETS_DEVICE_INTEGRITY"),
    ("other encryption key", "decrypted"), ("wrong enc", "A256KW and A256GCM"), ("app package", "appIntegrity.packageName"),
    ("critical extension", "crit"), ("compressed", "zip"),
])
def test_each_play_integrity_check_fails_on_its_own(gatehouse, play, case, words):
    client_id = instance(gatehouse)
    nonce = challenge(gatehouse, client_id)
    payload = {
        "wrong package": verdict(nonce, "com.example.other"),
        "unrecognized version": verdict(nonce, PACKAGE, app_verdict="UNRECOGNIZED_VERSION"),
        "stale": verdict(nonce, PACKAGE, timestamp_ms=int((time.time() - 600) * 1000)),
        "nonce mismatch": verdict("another nonce", PACKAGE),
        "weak device": verdict(nonce, PACKAGE, device=("MEETS_BASIC_INTEGRITY",)),
        "app package": verdict(nonce, PACKAGE, app_package="com.example.repackaged"),
    }.get(case, verdict(nonce, PACKAGE))
    if case == "bad signature":
        from cryptography.hazmat.primitives.asymmetric import ec
        token = integrity_token(play, payload, signing_key=ec.generate_private_key(ec.SECP256R1()))
    elif case == "other encryption key":
        token = integrity_token(PlayKeys(), payload)
    elif case == "wrong enc":
        token = integrity_token(play, payload, enc_header={"alg": "dir", "enc": "A256GCM"})
    elif case == "critical extension":
        # RFC 7516 §4.1.13: a header this reader does not understand, marked critical, refuses the token.
        token = integrity_token(play, payload, enc_header={"alg": "A256KW", "enc": "A256GCM", "crit": ["exp"], "exp": 1})
    elif case == "compressed":
        token = integrity_token(play, payload, enc_header={"alg": "A256KW", "enc": "A256GCM", "zip": "DEF"})
    else:
        token = integrity_token(play, payload)
    refused(send(gatehouse, client_id, nonce, type="play", integrity_token=token), words)


def test_malformed_statements_get_precise_errors_never_a_500(gatehouse):
    client_id = instance(gatehouse)
    for statement, error in [
        ({"type": "apple", "key_id": "!!", "attestation_object": "AAAA"}, "invalid_request"),
        ({"type": "apple", "key_id": "A" * 44, "attestation_object": "not base64 at all!"}, "invalid_request"),
        ({"type": "apple", "key_id": "A" * 43 + "=", "attestation_object": "oWNmbXRk"}, "invalid_attestation"),
        ({"type": "play", "integrity_token": "a.b.c"}, "invalid_attestation"),
        ({"type": "android"}, "invalid_request"),
        ({}, "invalid_request"),
    ]:
        answer = send(gatehouse, client_id, challenge(gatehouse, client_id), **statement)
        assert answer.status_code == 400 and answer.json()["error"] == error, (statement, answer.text)
