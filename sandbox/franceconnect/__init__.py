"""A FranceConnect (Particulier) look-alike ("double"), v2 and v1, for Gatehouse's end-to-end tests and demos.

Built from FranceConnect's published partner documentation (docs.partenaires.franceconnect.gouv.fr:
"Endpoints", "Scopes et claims", "Gestion des erreurs", "Déconnexion", "Évolutions v1 → v2") and
FranceConnect's own public code (france-connect/sources: core-fcp-low configuration;
france-connect/service-provider-example: the v1 flow), not from Gatehouse's code. Where the two
disagree the documentation wins; the choices are listed at the end of this docstring.

    .venv/bin/python -m sandbox.franceconnect --config cfg.json [--port 0] [--host 127.0.0.1] [--quiet]
    .venv/bin/python sandbox/franceconnect --config cfg.json …     (the same, from any directory)

Once listening it prints exactly one line to stdout and nothing after it:

    {"ready": true, "url": "http://127.0.0.1:PORT", "issuer": "http://127.0.0.1:PORT/api/v2",
     "id_token_iss": "http://127.0.0.1:PORT/api/v2", "version": "v2"}

`issuer` is what a client configures (v2: the OpenID issuer, discovery at
{issuer}/.well-known/openid-configuration; v1: the API base, endpoints {issuer}/authorize …);
`id_token_iss` is the `iss` of its ID tokens (v1: the bare origin, as FranceConnect v1 does).
Access log (method, path without query, status; never a secret) on stderr unless --quiet.
SIGTERM/SIGINT exit with status 0.

Config (JSON; every key but "clients" optional):

    {"version": "v2",                      # "v2" | "v1"
     "alg": "ES256",                       # v2 ID token and userinfo signature: "ES256" | "RS256"; v1: always HS256
     "prefix": "/api/v2",                  # default /api/v2 (v2), /api/v1 (v1)
     "access_token_lifetime": 60,          # seconds (FranceConnect: 60)
     "id_token_lifetime": 60, "code_lifetime": 30,
     "send_iss": true,                     # RFC 9207 `iss` on authorization responses (default: v2 yes, v1 no)
     "min_state_nonce_length": 32,         # v2 32 (documented), v1 1
     "accept_client_secret_basic": false,  # FranceConnect accepts client_secret_post (and private_key_jwt) only
     "clients": [{"client_id": "…", "client_secret_env": "FC_SECRET",   # or "client_secret": "…"
                  "redirect_uris": ["…"], "post_logout_redirect_uris": ["…"],
                  "scopes": ["openid", "given_name", …]}],               # allowed scopes (default: all below)
     "identities": [{…claims…}]}          # default: IDENTITIES below; `sub` is derived per client (pairwise)

Endpoints (P = prefix):

    v2  GET  P/.well-known/openid-configuration   discovery
        GET  P/jwks                                JWKS (an ES256 and an RS256 key; a rotated key once asked)
        GET|POST P/authorize                       validates, then 303 to P/interaction/{uid}; a malformed
                                                   request gets the HTML error page (400, "Y000400"), never a redirect
        GET  P/interaction/{uid}                   the login page: one radio button per identity, "Continuer", "Annuler"
        POST P/interaction/{uid}/login             identity=N → 303 redirect_uri?code&state[&iss]; sets the FC session cookie
        POST P/interaction/{uid}/abort             "Annuler" → 303 redirect_uri?error=access_denied&error_description&state[&iss]
        POST P/token                               authorization_code only; client_secret_post; code single use, 30 s;
                                                   {"access_token","token_type":"Bearer","expires_in":60,"id_token"}: no refresh_token
        GET|POST P/userinfo                        Bearer; 200 application/jwt (signed like the ID token:
                                                   {"sub", pivot claims as scoped, "iss", "aud"})
        GET  P/session/end                         id_token_hint, state, post_logout_redirect_uri all required, the URI registered;
                                                   else the HTML error page (400). Ends the session cookie, 303 to the URI ?state=
        POST P/token/revocation                    RFC 7009 (client_secret_post), 200
    v1  P/authorize, P/interaction/…, P/token, P/userinfo (200 application/json), P/logout (as session/end).
        ID token HS256 keyed with the client secret, `iss` = the origin (no /api/v1), no at_hash.

Control (for negative tests; not FranceConnect's):

    POST /_control  JSON, any of:
        {"id_token": NAME | [NAME, …]}     the next ID token(s) issued, one fault each: wrong_nonce, missing_nonce,
                                           wrong_aud, multiple_aud (no azp), wrong_iss, alg_none, hs256_public_key
                                           (HS256, the HMAC key = the PEM of the public key of the configured alg),
                                           hs256_wrong_secret (v1), expired, iat_future, unknown_kid (a key never
                                           published), rotated_kid (a new key, published from now on, signing this token only), bad_signature,
                                           wrong_acr, bad_at_hash, alg_mismatch (signed with the other published alg)
        {"userinfo": NAME | [NAME, …]}     the next userinfo answer(s): bad_signature, other_sub, unsigned (v2: JSON)
        {"callback": {"iss": URL} | "omit_iss"}   the next authorization response's `iss`
        {"authorize_error": CODE}          the next /authorize redirects at once with error=CODE (invalid_scope,
                                           invalid_request, server_error, temporarily_unavailable, access_denied)
        {"jwks": "unavailable" | "available"}     JWKS answers 503 while unavailable
        {"access_token_lifetime": SECONDS} tokens issued from now on
        {"expire_access_tokens": true}     every access token issued so far is dead from now on
        {"reset_stats": true}
    GET  /_control/stats  JSON counters: jwks_fetches, discovery_fetches, authorize (list: what was asked, with the
         lengths of state and nonce, never their values), token_requests, token_auth_methods, refresh_grants,
         userinfo_requests, userinfo_payloads (the exact JSON payload text of every userinfo answer),
         token_responses (bodies, for passthrough checks: they hold tokens), session_end (list: whether the
         hint was an ID token it issued, its sub and client, the state's length, the URI, the cookie, the outcome),
         last_access_token_alive,
         identities (the claims and sub per client), pending faults.

Secrets record: when GATEHOUSE_SECRETS_RECORD names a file, every secret this double is given or
gives out is appended to it as a JSON line {"kind", "value"}: client secrets, state and nonce of
every authorization request, PKCE verifiers, codes, access tokens, ID tokens (and hints), userinfo
JWTs, session cookies, interaction ids, logout states.

Choices where FranceConnect's sources differ or say nothing:
- state and nonce: the documentation says 32 characters minimum (POST table, callbacks); FranceConnect's
  code checks nonce ≥ 22 only. The double enforces 32 for both (v2).
- /session/end: the documentation marks id_token_hint, state and post_logout_redirect_uri required;
  FranceConnect's code only id_token_hint. The double requires all three. An expired id_token_hint is
  accepted (ID tokens live 60 s; logging out later must work), an unknown or forged one is not.
- `iss` on authorization responses (RFC 9207): not in the documentation's tables; FranceConnect runs
  node oidc-provider 9, which sends it. On by default in v2 (`send_iss`).
- PKCE: accepted and checked when the client sends code_challenge (S256), not required.

The package, one concern a module:

    catalog.py        scopes, claims, the made-up identities, fault names, the session cookie's name
    problem.py        Problem: a request answered with FranceConnect's HTML error page
    jose.py           compact JWS: signing keys, sign, decode, verify (also for the tests' own checks), at_hash
    provider.py       FranceConnect: configuration, clients, stats, control, discovery, JWKS
    authorization.py  what the person's browser visits: /authorize, the login page, login, abort, logout
    tokens.py         what the client calls: /token (and the ID token with its faults), /userinfo, revocation
    handler.py        the HTTP handler (routes, the access log) and the server class
    double.py         for the tests and demos: Double, Browser, gatehouse_upstream, start (runs it as a process)
    server.py         main: the command line, the ready line, SIGTERM
    __main__.py       `python -m sandbox.franceconnect` / `python sandbox/franceconnect`
"""

from .catalog import (ALL_SCOPES, CALLBACK_ERRORS, CLAIMS, ID_TOKEN_FAULTS, IDENTITIES, PIVOT_SCOPES,
                      SESSION_COOKIE, USERINFO_FAULTS)
from .double import Browser, Double, gatehouse_upstream, start
from .handler import ERROR_PAGE, Server, make_handler
from .jose import SigningKey, b64url, b64url_decode, decode_jws, half_hash, json_bytes, sign_jws, verify_jws
from .problem import Problem
from .provider import FranceConnect
from .server import main

__all__ = ["ALL_SCOPES", "CALLBACK_ERRORS", "CLAIMS", "ERROR_PAGE", "ID_TOKEN_FAULTS", "IDENTITIES", "PIVOT_SCOPES",
           "SESSION_COOKIE", "USERINFO_FAULTS", "Browser", "Double", "FranceConnect", "Problem", "Server",
           "SigningKey", "b64url", "b64url_decode", "decode_jws", "gatehouse_upstream", "half_hash", "json_bytes",
           "main", "make_handler", "sign_jws", "start", "verify_jws"]
