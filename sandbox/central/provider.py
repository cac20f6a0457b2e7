"""The central look-alike's state: its apps and their keys, users, codes, magic links, the email
window, faults, its clock and stats, and /_control. The endpoints are its parts: S2S (the API),
Pages (/auth, the magic link), Apple (the Apple stand-in)."""

import json
import threading
import time
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric import rsa

from .apple import Apple
from .constants import CODE_LIFETIME_MS, FAULT_ENDPOINTS, FAULT_KINDS, FIXTURES
from .javascript import random_id, random_token
from .pages import Pages
from .s2s import S2S
from .signing import load_private_key, load_public_key


class Central(S2S, Pages, Apple):
    """One central sign-in provider at `origin`, configured by `config` (the package's docstring),
    every secret it gives out added to `record`."""

    def __init__(self, config, record, origin):
        self.record, self.origin = record, origin
        self.apps = {}
        for app_id, app in config.get("apps", {}).items():
            pem = app.get("publicKeyPem") or Path(app["publicKeyFile"]).read_text()
            self.apps[app_id] = {"public_key": load_public_key(pem), "baseUrl": app["baseUrl"].rstrip("/"),
                                 "mobileScheme": app.get("mobileScheme")}
        self.apple_bundle_ids = dict(config.get("appleBundleIds", {}))
        self.magic_link_limit = int(config.get("magicLinkLimit", 5))
        self.default_user = config.get("defaultUser", {"email": "ada.lovelace@example.test", "name": "Ada Lovelace"})
        key_files = config.get("appleKeyFiles") or [str(FIXTURES / "apple-1-private.pem"), str(FIXTURES / "apple-2-private.pem")]
        self.apple_keys = {f"apple-test-{i + 1}": load_private_key(Path(f).read_bytes()) for i, f in enumerate(key_files)}
        self.apple_unknown_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.lock = threading.RLock()
        self.release = threading.Event()  # set on reset: "slow" answers stop waiting
        self.reset()

    def reset(self):
        with self.lock:
            self.release.set()
            self.release = threading.Event()
            self.users = {}            # email → {"id","email","name","signInProvider","createdAt"}
            self.codes = {}            # code → {"app","email","name","provider","userId","expiresAt"}
            self.magic_links = {}      # token → {"email","app","platform","createdAt","expiresAt","used"}
            self.sends = {}            # email → [ms of accepted sends]
            self.next_users = []
            self.faults = {}           # endpoint → {"kind","times","seconds"}
            self.offset_ms = 0
            self.frozen_ms = None      # the clock stands still at this time when set
            self.apple_published = list(self.apple_keys)
            self.stats = {"requests": {name: 0 for name in sorted(FAULT_ENDPOINTS)},
                          "s2s": {"accepted": 0, "refused": 0, "reasons": {}, "details": {}, "log": []},
                          "codes": {"issued": 0, "redeemed": 0, "refused": {"unknown": 0, "expired": 0, "other_app": 0}},
                          "magic_links": {"sent": 0, "rate_limited": 0, "by_email": {}},
                          "auth": [], "email_callbacks": [], "apple_keys_fetches": 0}

    def now_ms(self):
        return self.frozen_ms if self.frozen_ms is not None else int(time.time() * 1000) + self.offset_ms

    # ----- users and codes (broccoliapps.com/src/auth/users.ts, auth-callback.ts)

    def get_or_create_user(self, email, name, provider):
        user = self.users.get(email)
        if user is None:
            now = self.now_ms()
            user = {"id": random_id(now), "email": email, "name": name, "signInProvider": provider, "createdAt": now}
            self.users[email] = user
        return user

    def new_code(self, app, email, name, provider, lifetime_ms=CODE_LIFETIME_MS):
        user = self.get_or_create_user(email, name, provider)
        code = random_token()
        self.codes[code] = {"app": app, "email": email, "name": name, "provider": provider,
                            "userId": user["id"], "expiresAt": self.now_ms() + lifetime_ms}
        self.record.add("central auth code", code)
        self.stats["codes"]["issued"] += 1
        return code, user

    def redirect_for(self, app, platform, code):
        config = self.apps[app]
        if platform == "mobile" and config["mobileScheme"]:
            return f"{config['mobileScheme']}://auth/callback?code={code}"
        return f"{config['baseUrl']}/app/auth/callback?code={code}"

    # ----- faults

    def take_fault(self, endpoint):
        with self.lock:
            fault = self.faults.get(endpoint)
            if not fault:
                return None
            if fault["times"] is not None:
                fault["times"] -= 1
                if fault["times"] <= 0:
                    del self.faults[endpoint]
            return dict(fault, release=self.release)

    # ----- control

    def control(self, command):
        op = command.get("op")
        with self.lock:
            if op == "next_user":
                if not isinstance(command.get("email"), str) or not isinstance(command.get("name"), str):
                    raise ValueError("next_user needs email and name")
                self.next_users.append({"email": command["email"], "name": command["name"],
                                        "provider": command.get("provider")})
                return 200, {"queued": len(self.next_users)}
            if op == "mint_code":
                for key in ("app", "email", "name", "provider"):
                    if not isinstance(command.get(key), str):
                        raise ValueError(f"mint_code needs {key}")
                lifetime = int(command.get("lifetime_ms", CODE_LIFETIME_MS))
                code, user = self.new_code(command["app"], command["email"], command["name"], command["provider"], lifetime)
                return 200, {"code": code, "userId": user["id"]}
            if op == "last_magic_link":
                found = [(t, link) for t, link in self.magic_links.items() if link["email"] == command.get("email")]
                if not found:
                    return 404, {"error": "no magic link for that address"}
                token, link = max(found, key=lambda item: item[1]["createdAt"])
                return 200, {"token": token, "platform": link["platform"], "app": link["app"], "used": link["used"],
                             "url": f"{self.origin}/auth/email-callback?token={token}"}
            if op == "apple_token":
                return 200, self.apple_token(command)
            if op == "apple_jwks":
                publish = command.get("publish")
                if not isinstance(publish, list) or any(kid not in self.apple_keys for kid in publish):
                    raise ValueError(f"publish: a list of {sorted(self.apple_keys)}")
                self.apple_published = list(publish)
                return 200, {"published": self.apple_published}
            if op == "stats":
                return 200, self.public_stats()
            if op == "reset":
                self.reset()
                return 200, {"ok": True}
            if op == "fault":
                endpoint, kind = command.get("endpoint"), command.get("kind")
                if endpoint not in FAULT_ENDPOINTS or kind not in FAULT_KINDS:
                    raise ValueError(f"fault: endpoint in {sorted(FAULT_ENDPOINTS)}, kind in {sorted(FAULT_KINDS)}")
                if kind == "none":
                    self.faults.pop(endpoint, None)
                    self.release.set()  # requests held by "slow" end now, unanswered
                    self.release = threading.Event()
                else:
                    times = command.get("times")
                    self.faults[endpoint] = {"kind": kind, "times": int(times) if times is not None else None,
                                             "seconds": float(command.get("seconds", 30))}
                return 200, {"faults": self.faults}
            if op == "clock":
                if "now_ms" in command:
                    self.offset_ms = int(command["now_ms"]) - int(time.time() * 1000)
                elif "offset_ms" in command:
                    self.offset_ms = int(command["offset_ms"])
                self.frozen_ms = None
                if command.get("freeze"):
                    self.frozen_ms = int(command["now_ms"]) if "now_ms" in command else self.now_ms()
                return 200, {"now_ms": self.now_ms(), "offset_ms": self.offset_ms, "frozen": self.frozen_ms is not None}
            if op == "age":
                what, shift = command.get("what"), int(float(command.get("seconds", 0)) * 1000)
                if what not in ("codes", "magic_links", "emails", "all"):
                    raise ValueError("age: what in codes | magic_links | emails | all")
                if what in ("codes", "all"):
                    for code in self.codes.values():
                        code["expiresAt"] -= shift
                if what in ("magic_links", "all"):
                    for link in self.magic_links.values():
                        link["createdAt"] -= shift
                        link["expiresAt"] -= shift
                if what in ("emails", "all"):
                    self.sends = {email: [t - shift for t in sends] for email, sends in self.sends.items()}
                return 200, {"ok": True}
            if op == "users":
                return 200, {"users": list(self.users.values())}
            raise ValueError(f"unknown op {op!r}")

    def public_stats(self):
        with self.lock:
            return {**json.loads(json.dumps(self.stats)),
                    "users": list(self.users.values()),
                    "faults": json.loads(json.dumps(self.faults)),
                    "clock": {"now_ms": self.now_ms(), "offset_ms": self.offset_ms, "frozen": self.frozen_ms is not None},
                    "apple_published": list(self.apple_published),
                    "next_users": len(self.next_users)}
