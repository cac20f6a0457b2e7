"""The central look-alike's fixed values: the published lifetimes and limits (each with the
broccoliapps file it comes from), its S2S routes, the fault names /_control accepts, Hono's
not-found answer, valibot's email pattern, and the folder of the test keys."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository
FIXTURES = ROOT / "Tests" / "Fixtures" / "central"  # test keys, shared with the Swift tests

MAX_TIMESTAMP_AGE_MS = 15_000          # s2s.ts: Duration.seconds(15)
CODE_LIFETIME_MS = 60_000              # auth-callback.ts / email-callback.ts: Duration.minutes(1)
MAGIC_LINK_LIFETIME_MS = 15 * 60_000   # email.ts: Duration.minutes(15)
RATE_PERIOD_MS = 3_600_000             # email.ts: period "1h"
APPLE_ISSUER = "https://appleid.apple.com"
S2S_ROUTES = {"/api/v1/auth/verify": "verify", "/api/v1/auth/email": "email", "/api/v1/auth/verify-native": "verify-native"}
FAULT_ENDPOINTS = {"verify", "email", "verify-native", "auth", "email-callback", "apple_keys"}
FAULT_KINDS = {"down", "500", "garbage", "wrong_shape", "401", "403", "400", "429", "slow", "none"}
# Hono's own answer to a request no route matches (app.notFound's default): text, not the API's JSON.
HONO_NOT_FOUND = b"404 Not Found"
# valibot's EMAIL_REGEX (the `u` flag keeps \w ASCII).
EMAIL_REGEX = re.compile(r"^[\w+-]+(?:\.[\w+-]+)*@[\da-z]+(?:[.-][\da-z]+)*\.[a-z]{2,}$", re.ASCII | re.IGNORECASE)
