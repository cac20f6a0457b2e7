"""sealed.py's reading of a token endpoint's answer: whether it asks for the server's DPoP nonce."""

import types

from sealed import use_dpop_nonce


def answer(status, body, headers):
    def json():
        if body is None:
            raise ValueError("not JSON")
        return body
    return types.SimpleNamespace(status_code=status, headers=headers, json=json)


def test_use_dpop_nonce_needs_the_error_and_the_header():
    assert use_dpop_nonce(answer(400, {"error": "use_dpop_nonce"}, {"DPoP-Nonce": "n1"}))
    assert not use_dpop_nonce(answer(400, {"error": "use_dpop_nonce"}, {}))  # nothing to retry with
    assert not use_dpop_nonce(answer(400, {"error": "invalid_dpop_proof"}, {"DPoP-Nonce": "n1"}))
    assert not use_dpop_nonce(answer(401, {"error": "use_dpop_nonce"}, {"DPoP-Nonce": "n1"}))  # the resource's answer, not the token endpoint's
    assert not use_dpop_nonce(answer(400, None, {"DPoP-Nonce": "n1"}))
    assert not use_dpop_nonce(answer(200, {"access_token": "ghd_x"}, {"DPoP-Nonce": "n1"}))
