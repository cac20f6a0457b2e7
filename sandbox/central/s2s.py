"""The central look-alike's S2S API: each request verified the way api-router.ts and s2s.ts do,
in their order (headers, app, age, signature, then the content hash), then the DTO and the
handler: verify, email, verify-native. A part of Central (provider.py): it uses its state."""

import json

from .answers import Answer
from .constants import MAGIC_LINK_LIFETIME_MS, MAX_TIMESTAMP_AGE_MS, RATE_PERIOD_MS
from .javascript import b64url_decode_strict, canonical_payload, js_parse_int, random_token, sha256_hex
from .signing import PaddingError, rsa_public_decrypt
from .validation import EMAIL_SCHEMA, NATIVE_SCHEMA, VERIFY_SCHEMA, validate


class S2S:
    """The server-to-server endpoints (mixed into Central)."""

    # ----- S2S (api-router.ts + s2s.ts)

    def s2s(self, endpoint, url_path, headers, raw):
        """Returns (status, JSON value) or raises Answer. Records the request in stats. `url_path` is
        the path the request arrived on; the signature must cover exactly it."""
        app_id = headers.get("x-ba-app") or ""
        timestamp = headers.get("x-ba-request-timestamp") or ""
        signature = headers.get("x-ba-signature") or ""
        content_hash = headers.get("x-amz-content-sha256")
        text = raw.decode("utf-8", errors="replace")  # Request.text(): UTF-8, U+FFFD for bad bytes, BOM dropped
        if text.startswith("\ufeff"):
            text = text[1:]
        entry = {"endpoint": endpoint, "urlPath": url_path, "app": app_id, "timestamp": timestamp, "body": text,
                 "contentType": headers.get("content-type"), "contentSha256Header": content_hash}
        with self.lock:
            self.stats["requests"][endpoint] += 1
            self.stats["s2s"]["log"].append(entry)
        try:
            self.verify_s2s(app_id, timestamp, signature, url_path, text, raw, content_hash)
        except Answer as refusal:
            with self.lock:
                s2s = self.stats["s2s"]
                s2s["refused"] += 1
                s2s["reasons"][refusal.message] = s2s["reasons"].get(refusal.message, 0) + 1
                detail = refusal.detail or refusal.message
                s2s["details"][detail] = s2s["details"].get(detail, 0) + 1
                entry.update(outcome="refused", status=refusal.status, message=refusal.message, detail=detail)
            raise
        with self.lock:
            self.stats["s2s"]["accepted"] += 1
            entry.update(outcome="accepted")
        fault = self.take_fault(endpoint)
        if fault:
            entry.update(outcome="fault", fault=fault["kind"])
            return "fault", dict(fault, text=text, app_id=app_id, entry=entry)
        return self.s2s_handle(endpoint, app_id, text, entry)

    def s2s_handle(self, endpoint, app_id, text, entry):
        """After verification: api-router.ts's deserializeRequest (JSON.parse, {} when it fails), the DTO
        validation, then the handler. Returns (status, JSON value) or raises Answer."""
        try:
            data = json.loads(text)
        except ValueError:
            data = {}
        if not isinstance(data, dict):
            data = {}
        schema = {"verify": VERIFY_SCHEMA, "email": EMAIL_SCHEMA, "verify-native": NATIVE_SCHEMA}[endpoint]
        with self.lock:
            issues = validate(schema, data, self.apps)
            if issues:
                entry.update(status=400, message="Validation Error", detail="; ".join(issues))
                raise Answer(400, "Validation Error", issues)
            if data["app"] != app_id:  # double: the published code does not compare them
                entry.update(status=400, message="Validation Error", detail="body app differs from x-ba-app")
                reasons = self.stats["s2s"]["reasons"]
                reasons["app mismatch"] = reasons.get("app mismatch", 0) + 1
                raise Answer(400, "Validation Error", ["app: does not match x-ba-app"])
            try:
                status, value = getattr(self, "handle_" + endpoint.replace("-", "_"))(data)
            except Answer as answer:
                entry.update(status=answer.status, message=answer.message, detail=answer.detail)
                raise
            entry.update(status=status)
            return status, value

    def verify_s2s(self, app_id, timestamp, signature, path, text, raw, content_hash):
        if not app_id or not timestamp or not signature:
            missing = [n for n, v in (("x-ba-app", app_id), ("x-ba-request-timestamp", timestamp),
                                      ("x-ba-signature", signature)) if not v]
            raise Answer(401, "Missing S2S headers", detail="missing " + ", ".join(missing))
        app = self.apps.get(app_id)
        if app is None:
            raise Answer(401, "Unknown app", detail="unknown app")
        sent = js_parse_int(timestamp)
        if sent is None:
            raise Answer(401, "Request expired", detail="timestamp is not a number")
        age = self.now_ms() - sent
        if age > MAX_TIMESTAMP_AGE_MS:
            raise Answer(401, "Request expired", detail=f"timestamp {age} ms old")
        digest = sha256_hex(canonical_payload(app_id, path, timestamp, text))
        try:
            decoded = b64url_decode_strict(signature)
        except ValueError:
            raise Answer(401, "Invalid signature", detail="signature is not unpadded base64url") from None
        try:
            decrypted = rsa_public_decrypt(app["public_key"], decoded)
        except PaddingError as error:
            raise Answer(401, "Invalid signature", detail=f"public decrypt failed: {error}") from None
        if decrypted.decode("utf-8", errors="replace") != digest:
            raise Answer(401, "Invalid signature", detail="decrypted value is not the hash of the canonical payload")
        if content_hash != sha256_hex(raw):  # double: CloudFront's check
            raise Answer(401, "Invalid content hash",
                         detail="x-amz-content-sha256 missing" if content_hash is None else "x-amz-content-sha256 is not sha256(body)")

    def handle_verify(self, data):
        """verify.ts: the code must exist, be unexpired and belong to `app`; it is deleted once used."""
        code = self.codes.get(data["code"])
        refused = self.stats["codes"]["refused"]
        if code is None:
            refused["unknown"] += 1
            raise Answer(404, "Auth code not found", detail="unknown or used code")
        if code["expiresAt"] < self.now_ms():
            refused["expired"] += 1
            raise Answer(404, "Auth code not found", detail="expired code")
        if code["app"] != data["app"]:
            refused["other_app"] += 1
            raise Answer(404, "Auth code not found", detail="code of another app")
        del self.codes[data["code"]]
        self.stats["codes"]["redeemed"] += 1
        return 200, {"user": {"userId": code["userId"], "email": code["email"], "name": code["name"],
                              "provider": code["provider"]}}

    def handle_email(self, data):
        """email.ts: 5 per address per hour, then a 64-character token living 15 minutes."""
        email, now = data["email"], self.now_ms()
        window = [t for t in self.sends.get(email, []) if t > now - RATE_PERIOD_MS]
        self.sends[email] = window
        if len(window) >= self.magic_link_limit:
            self.stats["magic_links"]["rate_limited"] += 1
            raise Answer(429, "Too many requests. Please try again later.", detail="rate limited")
        window.append(now)
        token = random_token(64)
        self.magic_links[token] = {"email": email, "app": data["app"], "platform": data.get("platform"),
                                   "createdAt": now, "expiresAt": now + MAGIC_LINK_LIFETIME_MS, "used": False}
        self.record.add("central magic link token", token)
        ml = self.stats["magic_links"]
        ml["sent"] += 1
        ml["by_email"][email] = ml["by_email"].get(email, 0) + 1
        return 200, {"success": True}

    def handle_verify_native(self, data):
        """verify-native.ts: get-or-create by email; the stored user's fields (its first provider)."""
        user = self.get_or_create_user(data["email"], data["name"], data["provider"])
        return 200, {"user": {"userId": user["id"], "email": user["email"], "name": user["name"],
                              "provider": user["signInProvider"]}}
