"""The central look-alike's body checks: the published DTOs (central-auth.dto.ts) as schemas, with
valibot's issue messages; and email-callback.ts's name derived from an address."""

import json
import re

from .constants import EMAIL_REGEX


def _received(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (int, float)):
        return json.dumps(value)
    if value is None:
        return "null"
    if value is _MISSING:
        return "undefined"
    return "Array" if isinstance(value, list) else "Object"


_MISSING = object()


def _picklist(options):
    names = [json.dumps(o) for o in options]
    return names[0] if len(names) == 1 else "(" + " | ".join(names) + ")"


def validate(schema, data, apps):
    """schema: list of (key, kind); kind in app | code | email | name | platform | provider. Returns
    the valibot-style issue list ("key: message")."""
    issues = []
    for key, kind in schema:
        value = data.get(key, _MISSING)
        if kind == "platform":
            if value is _MISSING:
                continue
            if value != "mobile":
                issues.append(f'{key}: Invalid type: Expected ("mobile" | undefined) but received {_received(value)}')
            continue
        if kind == "provider":
            if value != "apple":
                issues.append(f'{key}: Invalid type: Expected "apple" but received {_received(value)}')
            continue
        if value is _MISSING:
            issues.append(f'{key}: Invalid key: Expected "{key}" but received undefined')
            continue
        if not isinstance(value, str):
            issues.append(f"{key}: Invalid type: Expected string but received {_received(value)}")
            continue
        if kind == "app" and value not in apps:
            issues.append(f"{key}: Invalid type: Expected {_picklist(sorted(apps))} but received {_received(value)}")
        elif kind == "code" and len(value.encode("utf-16-le")) // 2 > 1024:
            issues.append(f"{key}: Invalid length: Expected <=1024 but received {len(value.encode('utf-16-le')) // 2}")
        elif kind == "email" and not EMAIL_REGEX.match(value):
            issues.append(f"{key}: Invalid email: Received {_received(value)}")
    return issues


VERIFY_SCHEMA = [("app", "app"), ("code", "code")]
EMAIL_SCHEMA = [("app", "app"), ("email", "email"), ("platform", "platform")]
NATIVE_SCHEMA = [("app", "app"), ("email", "email"), ("name", "name"), ("provider", "provider")]


def derive_name_from_email(email):
    """email-callback.ts: john.doe@gmail.com → "John Doe"."""
    local = email.split("@")[0]
    return " ".join(part[:1].upper() + part[1:].lower() for part in re.split(r"[._-]+", local))
