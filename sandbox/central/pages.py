"""The central look-alike's pages: /auth (signs the next user in at once) and the magic link's
/auth/email-callback, each ending in a redirect with a fresh code. A part of Central (provider.py)."""

from .answers import PageAnswer
from .validation import derive_name_from_email


class Pages:
    """The browser-facing endpoints (mixed into Central)."""

    # ----- pages

    def auth_page(self, params):
        app, provider, platform = params.get("app"), params.get("provider"), params.get("platform")
        with self.lock:
            self.stats["requests"]["auth"] += 1
            if app not in self.apps or provider not in ("google", "apple") or platform not in (None, "mobile"):
                raise PageAnswer(400, "Validation Error")
            person = self.next_users.pop(0) if self.next_users else dict(self.default_user)
            provider = person.get("provider") or provider
            code, user = self.new_code(app, person["email"], person["name"], provider)
            self.stats["auth"].append({"app": app, "provider": provider, "platform": platform,
                                       "email": person["email"], "userId": user["id"]})
            return self.redirect_for(app, platform, code)

    def email_callback(self, params):
        token = params.get("token")
        with self.lock:
            self.stats["requests"]["email-callback"] += 1
            link = self.magic_links.get(token) if token else None
            if token is None:
                raise PageAnswer(400, "Validation Error")
            if link is None or link["used"]:
                self.stats["email_callbacks"].append({"outcome": "not found"})
                raise PageAnswer(404, "Invalid or expired link")
            link["used"] = True  # single use (published: deleted)
            if link["expiresAt"] < self.now_ms():
                self.stats["email_callbacks"].append({"outcome": "expired"})
                raise PageAnswer(410, "This link has expired. Please request a new one.")
            name = derive_name_from_email(link["email"])
            code, user = self.new_code(link["app"], link["email"], name, "email")
            self.stats["email_callbacks"].append({"outcome": "signed in", "email": link["email"], "userId": user["id"]})
            return self.redirect_for(link["app"], link["platform"], code)
