"""A "central" sign-in provider look-alike ("double", broccoliapps style) for Gatehouse's end-to-end tests and demos.

Built from the published broccoliapps code (github.com/mehmetatas/broccoliapps), not from
Gatehouse's: the S2S verifier framework/backend/src/http/s2s.ts and api-router.ts, the signer
framework/shared/src/contract.ts and crypto.ts, the central handlers
broccoliapps.com/src/api/handlers/auth/{verify,email,verify-native}.ts, the pages
broccoliapps.com/src/ui/server/pages/{auth.tsx,auth-callback.ts,email-callback.ts}, the DTOs
framework/shared/src/central-auth.dto.ts. Where the double goes further than the published code
it says so below ("double:").

    .venv/bin/python -m sandbox.central --config cfg.json [--port 0] [--host 127.0.0.1]
                                        [--record secrets.jsonl] [--quiet]
    .venv/bin/python sandbox/central --config cfg.json …     (the same, from any directory)

Once listening it prints exactly one line to stdout and nothing after it:

    {"ready": true, "url": "http://127.0.0.1:PORT", "port": PORT, "api_base": "http://127.0.0.1:PORT/api",
     "web_base": "http://127.0.0.1:PORT", "apple_jwks_url": "http://127.0.0.1:PORT/apple/auth/keys"}

Access log on stderr unless --quiet: method, path without query, status, and for a refused S2S
request its reason (never a code, token or signature). SIGTERM/SIGINT exit with status 0.

Config (JSON):

    {"apps": {"tasquito": {"publicKeyPem": "-----BEGIN PUBLIC KEY-----…",   # or "publicKeyFile": path
                           "baseUrl": "http://127.0.0.1:GH",                # Gatehouse's public base URL
                           "mobileScheme": "tasquito"}},                    # optional
     "appleBundleIds": {"tasquito": "com.broccoliapps.tasquito"},          # optional: default `aud` of apple_token
     "appleKeyFiles": ["…/apple-1-private.pem", "…/apple-2-private.pem"],   # default: Tests/Fixtures/central/
     "magicLinkLimit": 5,                                                   # published: 5 per address per hour
     "defaultUser": {"email": "ada.lovelace@example.test", "name": "Ada Lovelace"}}

Endpoints:

    POST /api/v1/auth/verify          S2S {"app","code"} → 200 {"user":{"userId","email","name","provider"}};
                                      unknown, expired (60 s), used, or other app's code → 404 "Auth code not found"
    POST /api/v1/auth/email           S2S {"app","email","platform"?:"mobile"} → 200 {"success":true}; the 6th
                                      accepted send for one address within an hour → 429
    POST /api/v1/auth/verify-native   S2S {"app","email","name","provider":"apple"} → 200 {"user":{…}} (get-or-create)
         (the routes are the contract paths: central-auth.ts declares them with `api(…, "/v1/auth/…")`,
          and contract.ts's `api` prefixes "/api"; the published signer posts to {baseUrl}/api/v1/auth/…
          and signs that same "/api/v1/auth/…". Without the prefix there is no route: 404. The signature
          is checked against the path the request arrived on (the raw request target, query dropped),
          never against anything the caller says about it.)
    GET  /auth?app&provider[&platform=mobile]   signs in the next user at once (no Cognito): a 60 s single-use
                                      code, 302 to {baseUrl}/app/auth/callback?code=… (or {mobileScheme}://auth/callback?code=…)
    GET  /auth/email-callback?token=  magic link (15 min, single use; unknown 404, expired 410) → code → 302 as above
    GET  /apple/auth/keys             the Apple stand-in's JWKS (RS256 keys "apple-test-1", "apple-test-2")

Every API error is api-router.ts's JSON {"status","message"[,"details"]} with the HTTP status
(verify.ts: `throw new HttpError(404, "Auth code not found")` → 404 {"status":404,"message":"Auth
code not found"}). A request no route matches (a path without /api, a GET on an S2S route) gets
Hono's default answer instead: 404 text/plain "404 Not Found".

S2S verification, in the published order (api-router.ts, s2s.ts), every refusal 401 {"status":401,"message":…}:
    any of x-ba-app, x-ba-request-timestamp, x-ba-signature missing or empty → "Missing S2S headers";
    app not configured → "Unknown app"; Date.now() - parseInt(timestamp) NaN or > 15000 → "Request expired"
    (a timestamp in the future passes, as published); RSA public "decrypt" of the base64url signature, the
    PKCS#1 v1.5 type-1 block checked as OpenSSL's RSA_padding_check_PKCS1_type_1 does, must give the
    64 hex characters of SHA-256(JSON.stringify({appId, body, path, timestamp}, sorted keys)) → else
    "Invalid signature". Then (double: CloudFront's check in production, not the verifier's)
    x-amz-content-sha256 must be the lowercase hex SHA-256 of the raw body → else "Invalid content hash".
    double: the signature must be exactly modulus-sized unpadded base64url (the published signer always
    makes that; Node would also take padded or short input). Then the body is validated as the DTOs say
    → 400 {"status":400,"message":"Validation Error","details":["field: problem", …]}; double: the body's
    `app` must equal x-ba-app (the published code does not compare them) → 400 "Validation Error",
    details ["app: does not match x-ba-app"]. Every refusal's reason (and a finer detail) is in stats.

Control (not the central provider's): POST /_control with a JSON object {"op": …}; answers 200 JSON
(400 {"error"} for a bad command, 404 {"error"} for last_magic_link with none):

    {"op":"next_user","email","name","provider"?}   queue the identity the next GET /auth signs in
                                                    (provider default: the query's); empty queue → defaultUser
    {"op":"mint_code","app","email","name","provider"}  → {"code","userId"} (get-or-create the user, as /auth does)
    {"op":"last_magic_link","email"}      → {"token","platform","app","url","used"} of the latest link sent to it
    {"op":"apple_token","claims":{…},"kid"?,"sign_with"?:"known"|"unknown","tamper"?:true,"app"?}
                                          → {"token"}: RS256 Apple-style identity token. Defaults: iss
                                          https://appleid.apple.com, aud appleBundleIds[app] (or the only one),
                                          iat now, exp now+600, auth_time, sub, email, email_verified; a claim
                                          given as null is left out. "known" (default) signs with the published key
                                          of `kid` (default apple-test-1); "unknown" with a key never published.
    {"op":"apple_jwks","publish":["apple-test-1", …]}   which Apple keys GET /apple/auth/keys lists
    {"op":"stats"}                        → the counters (also GET /_control/stats)
    {"op":"reset"}                        forget users, codes, links, sends, faults, clock, stats, queue
    {"op":"fault","endpoint":E,"kind":K,"times"?:N,"seconds"?:S}   E: verify | email | verify-native | auth |
                                          email-callback | apple_keys; K: down (connection closed, no answer),
                                          500, garbage (200, not JSON), wrong_shape (200 JSON of another shape),
                                          401 (Invalid signature), 403 ("Auth code could not be verified": verify.ts
                                          before the S2S signature), 400 (a "Validation Error" with details), 429, slow (answers after S seconds, default 30;
                                          a held request is dropped unanswered by reset or the fault's "none"),
                                          none (clears). Every request while set (or the next N). S2S requests are
                                          still verified first (stats say whether Gatehouse signed right).
    {"op":"clock","offset_ms":X} | {"op":"clock","now_ms":T}   the double's clock (S2S age, code and link
                                          expiry, the email window) = real time + X; "freeze": true stops it
                                          there (until the next clock op or reset); → {"now_ms","offset_ms","frozen"}
    {"op":"age","what":"codes"|"magic_links"|"emails"|"all","seconds":S}   make what exists S seconds older
    {"op":"users"}                        → {"users":[…]}

Stats ({"op":"stats"}): requests per endpoint; s2s {accepted, refused, reasons {message: n},
details {detail: n}, log [every S2S request: endpoint, urlPath, app, timestamp, body (raw text),
contentType, contentSha256Header, outcome, status, message, detail]}; codes {issued, redeemed,
refused {unknown, expired, other_app}}; magic_links {sent, rate_limited, by_email}; auth (list of
/auth sign-ins); email_callbacks; apple_keys_fetches; users; faults; clock.

Secrets record: --record FILE, else the file named by GATEHOUSE_SECRETS_RECORD: every auth code,
magic-link token and Apple identity token this double gives out is appended as {"kind","value"}.

Choices where the published code says nothing or the double differs:
- The email rate limit is a sliding hour of accepted sends per address (exact string, as published);
  published: fixed hour windows of a DynamoDB counter that also counts refused attempts.
- /auth takes `platform` from the query (published: a cookie set by the sign-in page).
- A failed /auth or /auth/email-callback answers a small HTML page with the status, as the page router.

The package, one concern a module:

    constants.py      the published lifetimes and limits, routes, fault names, the test keys' folder
    javascript.py     encodings as JavaScript does them: base64url, JSON.stringify, parseInt, random.ts
    signing.py        RSA "private encrypt" / "public decrypt" as OpenSSL does them; the published signer
    validation.py     the DTOs' checks with valibot's messages
    answers.py        Answer (the API's JSON error) and PageAnswer (a page's error)
    provider.py       Central: configuration, users and codes, faults, the clock, control, stats
    s2s.py            the S2S API: verification in the published order, then verify, email, verify-native
    pages.py          /auth and the magic link's /auth/email-callback
    apple.py          the Apple stand-in: its JWKS and identity tokens
    handler.py        the HTTP handler (routes, faults on the wire, the access log) and the server class
    double.py         for the tests and demos: Double, ControlError, app_config, gatehouse_upstream, start
    server.py         main: the command line, the ready line, SIGTERM
    __main__.py       `python -m sandbox.central` / `python sandbox/central`
"""

from .answers import Answer, PageAnswer
from .constants import (APPLE_ISSUER, CODE_LIFETIME_MS, EMAIL_REGEX, FAULT_ENDPOINTS, FAULT_KINDS, FIXTURES,
                        HONO_NOT_FOUND, MAGIC_LINK_LIFETIME_MS, MAX_TIMESTAMP_AGE_MS, RATE_PERIOD_MS, S2S_ROUTES)
from .double import ControlError, Double, app_config, gatehouse_upstream, start
from .handler import ERROR_PAGE, Server, make_handler
from .javascript import (b64url, b64url_decode_strict, canonical_payload, js_json_string, js_parse_int, random_id,
                         random_token, sha256_hex)
from .provider import Central
from .server import main
from .signing import (PaddingError, load_private_key, load_public_key, rsa_private_encrypt, rsa_public_decrypt,
                      sign_s2s)
from .validation import EMAIL_SCHEMA, NATIVE_SCHEMA, VERIFY_SCHEMA, derive_name_from_email, validate

__all__ = ["APPLE_ISSUER", "CODE_LIFETIME_MS", "EMAIL_REGEX", "EMAIL_SCHEMA", "ERROR_PAGE", "FAULT_ENDPOINTS",
           "FAULT_KINDS", "FIXTURES", "HONO_NOT_FOUND", "MAGIC_LINK_LIFETIME_MS", "MAX_TIMESTAMP_AGE_MS",
           "NATIVE_SCHEMA", "RATE_PERIOD_MS", "S2S_ROUTES", "VERIFY_SCHEMA", "Answer", "Central", "ControlError",
           "Double", "PageAnswer", "PaddingError", "Server", "app_config", "b64url", "b64url_decode_strict",
           "canonical_payload", "derive_name_from_email", "gatehouse_upstream", "js_json_string", "js_parse_int",
           "load_private_key", "load_public_key", "main", "make_handler", "random_id", "random_token",
           "rsa_private_encrypt", "rsa_public_decrypt", "sha256_hex", "sign_s2s", "start", "validate"]
