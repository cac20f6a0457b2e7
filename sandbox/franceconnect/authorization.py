"""What the person's browser visits at the FranceConnect look-alike: /authorize (FranceConnect's
checks, in its order), the login page, "Continuer" and "Annuler", the authorization response, and
the logout (/session/end, v1 /logout). A part of FranceConnect (provider.py): it uses its state."""

import html
import json
import secrets
import time
from urllib.parse import urlencode

from .problem import Problem


class Authorization:
    """FranceConnect's browser-facing endpoints (mixed into FranceConnect)."""

    # ----- authorization

    def authorize(self, params):
        """Validates an authorization request (FranceConnect's checks, in its order); returns
        ("page", uid) to show the login page or ("redirect", url) for an immediate error."""
        single = {k: v[0] for k, v in params.items()}
        self.record.add("Gatehouse state toward the upstream", single.get("state"))
        self.record.add("OpenID nonce", single.get("nonce"))
        asked = {"client_id": single.get("client_id"), "redirect_uri": single.get("redirect_uri"),
                 "response_type": single.get("response_type"), "scope": single.get("scope"),
                 "acr_values": single.get("acr_values"), "prompt": single.get("prompt"),
                 "claims": single.get("claims"), "state_length": len(single.get("state", "")),
                 "nonce_length": len(single.get("nonce", "")),
                 "code_challenge_method": single.get("code_challenge_method"),
                 "has_code_challenge": "code_challenge" in single, "outcome": None}
        with self.lock:
            self.stats["authorize"].append(asked)
        try:
            duplicated = [k for k, v in params.items() if len(v) > 1]
            if duplicated:
                raise Problem(f"parameters given more than once: {duplicated}")
            client = self.clients.get(single.get("client_id", ""))
            if client is None:
                raise Problem("client_id is unknown", code="Y030106")
            redirect_uri = single.get("redirect_uri", "")
            if redirect_uri not in client["redirect_uris"]:
                raise Problem("redirect_uri is not registered for this client", code="Y030118")
            if single.get("response_type") != "code":
                raise Problem("response_type must be code")
            scopes = single.get("scope", "").split()
            if "openid" not in scopes:
                raise Problem("scope must contain openid")
            acr_values = single.get("acr_values")
            if acr_values is None and self.version == "v2":
                raise Problem("acr_values is required")
            if acr_values is not None:
                requested = acr_values.split()
                allowed = {"eidas1"} if self.version == "v2" else {"eidas1", "eidas2", "eidas3"}
                if not requested or not set(requested) <= allowed:
                    raise Problem(f"acr_values must be eidas1 (got {acr_values[:32]!r})")
            state, nonce = single.get("state", ""), single.get("nonce", "")
            if len(state) < self.min_length:
                raise Problem(f"state must be at least {self.min_length} characters")
            if len(nonce) < self.min_length:
                raise Problem(f"nonce must be at least {self.min_length} characters")
            prompt = single.get("prompt")
            if prompt is not None and not set(prompt.split()) <= {"login", "consent"}:
                raise Problem("prompt must be login and/or consent")
            if "code_challenge" in single and single.get("code_challenge_method") != "S256":
                raise Problem("code_challenge_method must be S256")
            claims_request = {}
            if "claims" in single:
                try:
                    claims_request = json.loads(single["claims"])
                    assert isinstance(claims_request, dict)
                except (ValueError, AssertionError):
                    raise Problem("claims is not a JSON object") from None
        except Problem as problem:
            asked["outcome"] = f"error page: {problem}"
            raise
        error = self.take_fault("authorize_error")
        if error is None:
            unknown = [s for s in scopes if s not in client["scopes"]]
            if unknown:
                error = "invalid_scope"
        if error is not None:
            asked["outcome"] = f"redirect {error}"
            return "redirect", self.callback_url(redirect_uri, {"error": error, "error_description": {
                "invalid_scope": "Scopes not allowed for this service provider",
                "access_denied": "User auth aborted"}.get(error, error.replace("_", " ")), "state": state})
        uid = secrets.token_urlsafe(24)
        self.record.add("FranceConnect interaction id", uid)
        with self.lock:
            self.interactions[uid] = {"client": client, "redirect_uri": redirect_uri, "state": state, "nonce": nonce,
                                      "scopes": scopes, "acr": "eidas1", "claims": claims_request,
                                      "code_challenge": single.get("code_challenge"), "created": time.time()}
        asked["outcome"] = "login page"
        return "page", uid

    def callback_url(self, redirect_uri, parameters):
        fault = self.take_fault("callback")
        if fault == "omit_iss":
            pass
        elif isinstance(fault, dict) and "iss" in fault:
            parameters["iss"] = fault["iss"]
        elif self.send_iss:
            parameters["iss"] = self.issuer
        separator = "&" if "?" in redirect_uri else "?"
        return redirect_uri + separator + urlencode(parameters)

    def interaction(self, uid):
        with self.lock:
            found = self.interactions.get(uid)
        if found is None:
            raise Problem("this sign-in is unknown or over", code="Y000004")
        return found

    def login_page(self, uid):
        interaction = self.interaction(uid)
        choices = "\n".join(
            f'<li><label><input type="radio" name="identity" value="{i}" id="identity-{i}"{" checked" if i == 0 else ""}>'
            f' {html.escape(p["given_name"])} {html.escape(p["family_name"])}</label></li>'
            for i, p in enumerate(self.identities))
        base = f"{self.prefix}/interaction/{uid}"
        return f"""<!doctype html>
<html lang="fr"><head><meta charset="utf-8"><title>FranceConnect (double de test)</title></head>
<body>
<h1>Je choisis un compte pour me connecter sur {html.escape(interaction["client"]["name"])}</h1>
<form method="post" action="{base}/login" id="login-form">
<fieldset><legend>Identité</legend><ul>
{choices}
</ul></fieldset>
<button type="submit" id="continue">Continuer</button>
</form>
<form method="post" action="{base}/abort" id="cancel-form">
<button type="submit" id="cancel">Annuler</button>
</form>
</body></html>
"""

    def login(self, uid, form, cookie):
        interaction = self.interaction(uid)
        try:
            index = int(form.get("identity", ["0"])[0])
            self.identities[index]
        except (ValueError, IndexError):
            raise Problem("no such identity") from None
        client = interaction["client"]
        code = secrets.token_urlsafe(32)
        self.record.add("upstream authorization code", code)
        with self.lock:
            del self.interactions[uid]
            session = cookie if cookie in self.sessions else None
            if session is None:
                session = secrets.token_urlsafe(32)
                self.record.add("FranceConnect session cookie", session)
                self.sessions[session] = {"created": time.time()}
            self.sessions[session]["sub"] = self.sub_for(client["client_id"], index)
            self.codes[code] = {**interaction, "identity": index, "expires_at": time.time() + self.code_lifetime,
                                "used": False, "session": session, "auth_time": int(time.time()), "tokens": []}
            self.stats["logins"] += 1
        return session, self.callback_url(interaction["redirect_uri"], {"code": code, "state": interaction["state"]})

    def abort(self, uid):
        interaction = self.interaction(uid)
        with self.lock:
            self.interactions.pop(uid, None)
            self.stats["cancels"] += 1
        return self.callback_url(interaction["redirect_uri"], {
            "error": "access_denied", "error_description": "User auth aborted", "state": interaction["state"]})

    # ----- logout

    def end_session(self, params, cookie):
        single = {k: v[0] for k, v in params.items()}
        hint, state, uri = single.get("id_token_hint"), single.get("state"), single.get("post_logout_redirect_uri")
        self.record.add("upstream ID token", hint)
        self.record.add("Gatehouse logout state toward the upstream", state)
        with self.lock:
            issued = self.issued_id_tokens.get(hint) if hint else None
        entry = {"id_token_hint_issued": issued is not None,  # the hint and the state themselves stay out of stats
                 "sub": issued["sub"] if issued else None, "client_id": issued["client_id"] if issued else None,
                 "state_length": len(state or ""), "post_logout_redirect_uri": uri,
                 "had_session_cookie": bool(cookie and cookie in self.sessions), "outcome": None}
        with self.lock:
            self.stats["session_end"].append(entry)
        try:
            if not hint:
                raise Problem("id_token_hint is required")
            if issued is None:
                raise Problem("id_token_hint is not an ID token FranceConnect issued")
            if not state:
                raise Problem("state is required")
            if not uri:
                raise Problem("post_logout_redirect_uri is required")
            if uri not in self.clients[issued["client_id"]]["post_logout_redirect_uris"]:
                raise Problem("post_logout_redirect_uri is not registered for this client")
        except Problem as problem:
            entry["outcome"] = f"error page: {problem}"
            raise
        with self.lock:
            if cookie:
                self.sessions.pop(cookie, None)
            self.sessions.pop(issued["session"], None)
        entry["outcome"] = "redirect"
        separator = "&" if "?" in uri else "?"
        return uri + separator + urlencode({"state": state})
