// Regenerates s2s-vectors.json: S2S request signatures exactly as the published broccoliapps
// signer makes them (framework/shared/src/contract.ts + framework/backend/src/crypto.ts):
//   canonical = JSON.stringify(payload, Object.keys(payload).sort()), payload = {appId, body, path, timestamp}
//   hash      = hex SHA-256 of canonical (UTF-8)
//   signature = base64url(crypto.privateEncrypt(appPrivateKey, Buffer.from(hash, "utf8")))  (PKCS#1 v1.5 type 1)
// Deterministic (type-1 padding has no randomness): re-running gives byte-identical output.
// Usage: node Tests/Fixtures/central/make-vectors.mjs   (node:crypto only, no npm packages)
import { createHash, privateEncrypt } from "node:crypto";
import { readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const appId = "tasquito";
const privateKeyFile = "app-private.pem";
const privateKey = readFileSync(join(here, privateKeyFile), "utf8");

const sha256 = (text) => createHash("sha256").update(text).digest("hex");

// Bodies as Gatehouse sends them: JSON.stringify of the object literal (key order as written).
const cases = [
  { name: "verify", path: "/v1/auth/verify", timestamp: "1764000000000",
    body: JSON.stringify({ app: appId, code: "abc" }) },
  { name: "email", path: "/v1/auth/email", timestamp: "1764000000001",
    body: JSON.stringify({ app: appId, email: "zoe@example.test" }) },
  { name: "email-mobile", path: "/v1/auth/email", timestamp: "1764000000002",
    body: JSON.stringify({ app: appId, email: "zoe@example.test", platform: "mobile" }) },
  { name: "verify-native-non-ascii", path: "/v1/auth/verify-native", timestamp: "1764000000003",
    body: JSON.stringify({ app: appId, email: "zoe.unal@example.test", name: "Zoë Ünal 山田", provider: "apple" }) },
  // A string value holding " \ / newline tab U+0001 U+2028 (and U+2029, U+001F, U+007F, an emoji):
  // the body text carries JSON escapes, which the canonical JSON escapes a second time.
  { name: "verify-native-escapes", path: "/v1/auth/verify-native", timestamp: "1764000000004",
    body: JSON.stringify({ app: appId, email: "esc@example.test",
      name: "a\"b\\c/d\ne\tf\u0001g\u2028h\u2029i\u001fj\u007fk\u{1F966}l", provider: "apple" }) },
  // Raw characters in the body TEXT itself (pretty-printed JSON with a newline and a tab, a raw U+2028
  // inside a string): the canonical escapes \n and \t once and writes U+2028 raw.
  { name: "verify-raw-whitespace", path: "/v1/auth/verify", timestamp: "1764000000005",
    body: "{\n\t\"app\": \"tasquito\",\n\t\"code\": \"x\u2028y\"\n}" },
  // A body text with raw control characters (not valid JSON: signature-level test only):
  // U+0000, U+0001, \b, \f, \r, U+001F → \u0000 \u0001 \b \f \r \u001f.
  { name: "raw-controls", path: "/v1/auth/verify", timestamp: "1764000000006",
    body: "\u0000\u0001\b\f\r\u001f\"\\/" },
  // The real routes: central-auth.ts declares `api("POST", "/v1/auth/…")` and contract.ts's `api`
  // prefixes "/api", so the published client signs "/api/v1/auth/…", posts to {baseUrl}/api/v1/auth/…,
  // and the provider verifies against the route it registered, the same "/api/v1/auth/…". The
  // vectors above (path without "/api") pin the canonical JSON only: no provider route accepts them.
  { name: "api-verify", path: "/api/v1/auth/verify", timestamp: "1764000000007",
    body: JSON.stringify({ app: appId, code: "abc" }) },
  { name: "api-email", path: "/api/v1/auth/email", timestamp: "1764000000008",
    body: JSON.stringify({ app: appId, email: "zoe@example.test" }) },
  { name: "api-email-mobile", path: "/api/v1/auth/email", timestamp: "1764000000009",
    body: JSON.stringify({ app: appId, email: "zoe@example.test", platform: "mobile" }) },
  { name: "api-verify-native-non-ascii", path: "/api/v1/auth/verify-native", timestamp: "1764000000010",
    body: JSON.stringify({ app: appId, email: "yuki.yamada@example.test", name: "Yūki Ünal 山田", provider: "apple" }) },
  { name: "api-verify-native-escapes", path: "/api/v1/auth/verify-native", timestamp: "1764000000011",
    body: JSON.stringify({ app: appId, email: "esc.api@example.test",
      name: "a\"b\\c/d\ne\tf\u0001g\u2028h\u2029i\u001fj\u007fk\u{1F966}l", provider: "apple" }) },
];

const vectors = cases.map(({ name, path, timestamp, body }) => {
  const payload = { appId, path, timestamp };
  payload.body = body;
  const canonical = JSON.stringify(payload, Object.keys(payload).sort());
  const hash = sha256(canonical);
  const signature = privateEncrypt(privateKey, Buffer.from(hash, "utf8")).toString("base64url");
  return { name, path, timestamp, body, canonical, hash, contentSha256: sha256(body), signature };
});

writeFileSync(join(here, "s2s-vectors.json"), JSON.stringify({ appId, privateKeyFile, vectors }, null, 2) + "\n");
