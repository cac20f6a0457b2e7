"""The relay's edge (issue 7), end to end over raw sockets: no relayed path leaves its route's
backend prefix, both relay paths admit exactly the same requests, forwarding headers and
request ids a client sends never reach a backend as Gatehouse's own, framing is answered as
RFC 9112 says, and a relay-wiring state is never consumed at the callback.

"Both paths" means, for real: a fresh token's first request is an identity-cache miss and
takes the general path (Hummingbird + AsyncHTTPClient); a warm token's GET without a body
takes the fast path (the NIO handler); `served_by` reads which one answered from the request's
log line. A request refused before its token is looked at is answered by the general path
whatever its method (only the general path writes refusals); the property test reaches the
general path for accepted requests with an empty chunked POST (a chunked body always goes the
general way; a small `Content-Length` body may take the fast path since issue 12).
"""

import hashlib
import os
import random
import re
import secrets
import threading
import time
from collections import Counter
from urllib.parse import urlsplit

import pytest
import requests

from sandbox.gatelog import served_by
from sandbox.nativeapp import App
from rawhttp import RawClient, request

ROUTE, BACKEND_PATH = "/api/contracts", "/contracts"


@pytest.fixture(scope="module")
def warm(tokens):
    """alice's token, warm for /api/contracts (and /api/json)."""
    token = tokens.warm("/api/contracts")
    assert tokens.warm("/api/json") is not None
    return token


def problem(response, status, code):
    """Asserts `response` is the problem+json answer `status` / `code`."""
    assert response is not None, "the connection was closed without an answer"
    assert response.status == status, response
    assert response.header("Content-Type", "").startswith("application/problem+json"), response.headers
    assert response.json()["code"] == code, response.json()


def send(gatehouse, method, target, token=None, headers=(), body=b"", **options):
    """One request on a connection of its own; the answer (None if closed without one)."""
    headers = list(headers)
    if token:
        headers.insert(0, ("Authorization", f"Bearer {token}"))
    with RawClient(gatehouse["port"]) as client:
        return client.exchange(request(method, target, headers, body, **options), head_request=method == "HEAD")


# =========================================================================== B. paths

PCHAR = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~!$&'()*+,;=:@")
UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
HEXDIGITS = frozenset(b"0123456789abcdefABCDEF")


def _percent_decode(data):
    """Decodes %XX (the caller has checked they are well formed)."""
    out, i = bytearray(), 0
    while i < len(data):
        if data[i] == 0x25:
            out.append(int(data[i + 1:i + 3], 16))
            i += 3
        else:
            out.append(data[i])
            i += 1
    return bytes(out)


def _well_formed_percents(data):
    i = 0
    while i < len(data):
        if data[i] == 0x25:
            if i + 2 >= len(data) or data[i + 1] not in HEXDIGITS or data[i + 2] not in HEXDIGITS:
                return False
            i += 3
        else:
            i += 1
    return True


def refusal(rest, query):
    """The reference classifier of issue 7's rules: why Gatehouse must refuse the rest of the
    path `rest` (bytes after the route prefix, "" or starting with "/") and the query `query`
    (bytes after the first "?", or None), or None when it must carry them byte for byte."""
    if b"#" in rest or (query is not None and b"#" in query):
        return "fragment"
    if any(byte not in PCHAR and byte not in b"%/" for byte in rest):
        return "character outside pchar in the path"
    if not _well_formed_percents(rest):
        return "malformed percent-encoding in the path"
    decoded = _percent_decode(rest)
    if any(byte < 0x20 or byte == 0x7F for byte in decoded):
        return "control character"
    if re.search(rb"%(2f|5c)", rest, re.IGNORECASE):
        return "encoded slash or backslash"
    if any(int(hexpair, 16) in UNRESERVED for hexpair in re.findall(rb"%([0-9a-fA-F]{2})", rest)):
        return "needlessly encoded unreserved character (a backend may decode it to another path)"
    try:
        decoded.decode("utf-8", errors="strict")  # refuses overlong forms, surrogates, > U+10FFFF
    except UnicodeDecodeError:
        return "not UTF-8"
    if rest:
        segments = rest[1:].split(b"/")
        for index, segment in enumerate(segments):
            if segment == b"" and index == len(segments) - 1:
                break  # a trailing slash ends the path
            if _percent_decode(segment.split(b";")[0]) in (b"", b".", b".."):
                return "empty, '.' or '..' segment"
    if query is not None:
        if any(byte not in PCHAR and byte not in b"%/?" for byte in query):
            return "character outside the query's"
        if not _well_formed_percents(query):
            return "malformed percent-encoding in the query"
    return None


def test_the_reference_classifier_itself():
    """The examples of the issue, so the classifier the property test trusts is checked too."""
    refused = [b"/%ff", b"/%c0%ae", b"/%e0%80%af", b"/%ed%a0%80", b"/%80", b"/a%00b", b"/%1f", b"/%7f",
               b"/a%2fb", b"/a%5Cb", b"/a\\b", b"//a", b"/a//b", b"/..;/x", b"/.;x", b"/%2e%2e;jsessionid=1",
               b"/;x", b"/.", b"/..", b"/%2e", b"/a/%2E%2e/b", b"/%zz", b"/%4", b"/a b", b"/\xc3\xa9", b"/a#b"]
    for rest in refused:
        assert refusal(rest, None) is not None, rest
    refused += [b"/%41", b"/%7e", b"/%61dmin", b"/a%2Db"]
    for rest in refused:
        assert refusal(rest, None) is not None, rest
    accepted = [b"", b"/", b"/a/", b"/%21", b"/%C3%A9", b"/...", b"/.a", b"/a.", b"/a;b=c",
                b"/x;jsessionid=1/y", b"/%25", b"/%3b", b"/!$&'()*+,=:@~-._"]
    for rest in accepted:
        assert refusal(rest, None) is None, rest
    assert refusal(b"/x", b"x=1&admin=true/?%ff%00") is None
    assert refusal(b"/x", b"a=%zz") is not None
    assert refusal(b"/x", b"a=[1]") is not None


#: Pieces of path segments: plain, or hostile in one of the ways the rules name.
GOOD_PIECES = [
    "a", "42", "lines", "x-y", "x_y", "a.b", "~u", "!", "$", "&", "'", "(", ")", "*", "+", ",", "=", ":", "@",
    "%20", "%25", "%2B", "%3b", "%3F", "%23", "%C3%A9", "%e2%82%ac", "%F0%9F%98%80",
    "...", ".x", "x.", "a;b=c", ";jsessionid=1", "%22", "%3c",
]
BAD_PIECES = [
    "%ff", "%80", "%c0%ae", "%c0%af", "%e0%80%af", "%ed%a0%80", "%f4%90%80%80", "%c3", "%e2%82",
    "%41", "%7e", "%7E", "%2ex", "%61dmin", "%2D",
    "%00", "%0a", "%0d%0a", "%1f", "%7f", "%2f", "%2F", "%5c", "%5C", "%", "%g1", "%1", "%zz", "%%",
    "\\", "\xc3\xa9", "\xff", "|", "^", "`", "{", "}", "[", "]", "<", ">", '"', "#frag",
    " ", "\t", "\x01", "\x7f",  # break the request line: the HTTP/1.1 parser's 400
]
#: Whole segments that are hostile as segments (dots, empty, parameters only).
BAD_SEGMENTS = [".", "..", "%2e", "%2E%2e", "%2e.", ".%2e", "..;", ".;x", "%2e%2e;jsessionid=1", ";x", "", "..;a=b"]
GOOD_QUERY = ["x=1", "admin=true", "a=%41", "q=%ff", "n=%00", "b=/c", "d=?e", "e=", "f=a+b", "g=%2F", "h=:@!$'()*,;"]
BAD_QUERY = ["e=%zz", "f=[1]", "g=%4", "h=\\", "i=\xff", "j=#x", "k={}", "l=|", 'm="']


def generate_cases(seed, count):
    """`count` (rest, query) pairs (bytes; query None for none), mixing valid and hostile pieces."""
    rng = random.Random(seed)
    cases = []
    for _ in range(count):
        roll = rng.random()
        if roll < 0.02:
            rest = ""
        else:
            segments = []
            for _ in range(rng.randint(1, 4)):
                if rng.random() < 0.08:
                    segments.append(rng.choice(BAD_SEGMENTS))
                    continue
                pieces = [rng.choice(BAD_PIECES if rng.random() < 0.07 else GOOD_PIECES) for _ in range(rng.randint(1, 3))]
                segments.append("".join(pieces))
            rest = "/" + "/".join(segments) + ("/" if rng.random() < 0.05 else "")
            if rest[-1] in " \t":
                # Whitespace at the very end of the target is the request line's separator to
                # the HTTP parser, not part of the path: keep it inside the path instead.
                rest += "x"
        query = None
        if rng.random() < 0.4:
            parts = [rng.choice(BAD_QUERY if rng.random() < 0.05 else GOOD_QUERY) for _ in range(rng.randint(1, 3))]
            query = "&".join(parts)
        cases.append((rest.encode("latin-1"), None if query is None else query.encode("latin-1")))
    return cases


def target_of(rest, query, prefix=ROUTE.encode()):
    return prefix + rest + (b"" if query is None else b"?" + query)


def exchange_all(port, payloads, head_requests=False, depth=1):
    """Sends every request, `depth` at a time on one keep-alive connection (pipelined when
    depth > 1), opening a new connection whenever Gatehouse closes one. Returns one entry per
    request: its RawResponse, or None if a new connection was closed without an answer to it.
    (A reused connection closed without a word is tried again once on a new one: a keep-alive
    connection may close between two requests.)"""
    answers = [None] * len(payloads)
    client, used = RawClient(port, timeout=30), False
    index = 0
    try:
        for _ in range(4 * len(payloads) + 4):  # bounded: every turn answers a request or renews the connection once
            if index >= len(payloads):
                break
            batch = payloads[index:index + depth]
            try:
                client.send(b"".join(batch))
                sent = True
            except OSError:
                sent = False
            got = 0
            while sent and got < len(batch):
                try:
                    answer = client.read_response(head_request=head_requests)
                except EOFError:
                    answer = None
                if answer is None:
                    break
                answers[index + got] = answer
                got += 1
                if answer.closes:
                    break
            if got == 0 and used:
                client.close()
                client, used = RawClient(port, timeout=30), False
                continue  # the same batch again, on a new connection
            used = True
            if got < len(batch) or answers[index + got - 1].closes:
                client.close()
                client, used = RawClient(port, timeout=30), False
            index += max(got, 1)  # a request a new connection closed on is recorded as None
        assert index >= len(payloads), "exchange_all did not finish"
    finally:
        client.close()
    return answers


#: Requests in flight per connection. 1: an error that closes the connection can never take
#: a neighbour's answer with it, and each accepted GET finds the fast path free.
DEPTH = int(os.environ.get("GATEHOUSE_PATH_DEPTH", "1"))


def test_thousands_of_generated_paths_never_leave_the_backend_prefix_and_both_paths_agree(gatehouse, relay_doubles, warm):
    seed = int(os.environ.get("GATEHOUSE_PATH_SEED", "20261123"))
    count = int(os.environ.get("GATEHOUSE_PATH_CASES", "3000"))
    cases = generate_cases(seed, count)
    backend = relay_doubles["backend"]
    auth = [("Authorization", f"Bearer {warm}")]
    fast_requests = [request("GET", target_of(rest, query), auth) for rest, query in cases]
    general_requests = [request("POST", target_of(rest, query), auth + [("Transfer-Encoding", "chunked")], b"0\r\n\r\n", length=False)
                        for rest, query in cases]

    mark = backend.mark()
    started = time.monotonic()
    results, took, errors = {}, {}, {}

    def run(kind, payloads, depth):
        begun = time.monotonic()
        try:
            results[kind] = exchange_all(gatehouse["port"], payloads, depth=depth)
        except Exception as error:  # noqa: BLE001 - reported below
            errors[kind] = error
        took[kind] = time.monotonic() - begun

    threads = [threading.Thread(target=run, args=("fast", fast_requests, DEPTH)),
               threading.Thread(target=run, args=("general", general_requests, DEPTH))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    elapsed = time.monotonic() - started
    assert errors == {} and set(results) == {"fast", "general"}, f"a sender did not finish: {errors}"
    seen = backend.request_lines_since(mark)
    print(f"{len(cases)} paths on both relay paths in {elapsed:.1f} s (fast {took.get('fast', 0):.1f} s, general "
          f"{took.get('general', 0):.1f} s; seed {seed}); the backend read {len(seen)} requests")

    def show(case):
        return target_of(*case).decode("latin-1")

    # (1) Nothing the backend read during the test is outside the route's backend path.
    escaped = [target for _, target in seen
               if not (target == BACKEND_PATH.encode() or target.startswith((BACKEND_PATH + "/").encode())
                       or target.startswith((BACKEND_PATH + "?").encode()))]
    assert escaped == [], f"requests left {BACKEND_PATH}/ (seed {seed}): {escaped[:20]}"

    expected_targets = {}
    problems = []
    for case, fast, general in zip(cases, results["fast"], results["general"]):
        rest, query = case
        want = refusal(rest, query)
        statuses = (fast and fast.status, general and general.status)
        # (4) The reference classifier and Gatehouse agree, on both paths.
        if want is None:
            if statuses != (200, 200):
                problems.append(f"{show(case)!r}: accepted by the rules, answered {statuses}")
                continue
            # (3) Carried byte for byte: backend path + raw rest + raw query.
            expected = (BACKEND_PATH.encode() + rest + (b"" if query is None else b"?" + query)).decode("latin-1")
            carried = (fast.json()["path"], general.json()["path"])
            # (2) Both paths sent the backend the very same target.
            if carried != (expected, expected):
                problems.append(f"{show(case)!r}: expected the backend to see {expected!r}, it saw {carried}")
            expected_targets[expected.encode("latin-1")] = case
        else:
            if statuses != (400, 400):
                problems.append(f"{show(case)!r} ({want}): refused by the rules, answered {statuses}")
                continue
            for answer in (fast, general):
                if not answer.header("Content-Type", "").startswith("application/problem+json") or answer.json().get("code") != "bad_request":
                    problems.append(f"{show(case)!r}: 400 without a bad_request problem: {answer}")
                    break
    assert problems == [], f"{len(problems)} of {len(cases)} paths went wrong (seed {seed}):\n" + "\n".join(problems[:40])

    # What reached the backend is the accepted targets, each at least once per path, and nothing else.
    counted = Counter(target for _, target in seen)
    refused_but_relayed = [target for target in counted if target not in expected_targets]
    assert refused_but_relayed == [], f"refused paths reached the backend: {refused_but_relayed[:20]}"
    owed = Counter(target_of(*case, prefix=BACKEND_PATH.encode()) for case in cases if refusal(*case) is None)
    missing = [target for target, times in owed.items() if counted[target] < 2 * times]
    assert missing == [], f"accepted paths the backend did not see on both paths: {missing[:20]}"
    accepted = sum(refusal(*case) is None for case in cases)
    assert accepted >= len(cases) // 5 and len(cases) - accepted >= len(cases) // 5, "the generator should mix both kinds"

    # Which path answered: every accepted GET of the warm token was the fast path's, every POST the general one's.
    wrong_path = []
    for case, fast, general in zip(cases, results["fast"], results["general"]):
        if refusal(*case) is None:
            for answer, path in ((fast, "fast"), (general, "general")):
                if served_by(gatehouse, answer) != path:
                    wrong_path.append((show(case), path, served_by(gatehouse, answer)))
    assert wrong_path == [], f"answered by the other relay path: {wrong_path[:20]}"


def assert_400_never_relayed(gatehouse, relay_doubles, method, target, token):
    """`method` `target` with `token` (GET for the fast path, POST with an empty body for the
    general one) is a problem+json 400 and no request reached the backend."""
    backend = relay_doubles["backend"]
    mark, calls = backend.mark(), backend.calls
    response = send(gatehouse, method, target, token, [("Content-Length", "0")] if method == "POST" else [])
    problem(response, 400, "bad_request")
    assert backend.request_lines_since(mark) == [] and backend.calls == calls


@pytest.mark.parametrize("method", ["GET", "POST"], ids=["fast", "general"])
@pytest.mark.parametrize("target", [
    "/api/contracts/%ff?x=1&admin=true",          # the headline: reached the backend as /?x=1&admin=true
    "/api/contracts/%ff",
    "/api/contracts/42/%c0%ae%c0%ae/admin",       # overlong '.'
    "/api/contracts/%e0%80%af",                   # overlong '/'
    "/api/contracts/%ed%a0%80",                   # a UTF-16 surrogate
    "/api/contracts/%80",                         # a lone continuation byte
    "/api/contracts/..;/admin",                   # '..' to a servlet container
    "/api/contracts/.;x/admin",
    "/api/contracts/x/%2e%2e;jsessionid=1/admin",
    "/api/contracts/;x",
    "/api/contracts/a%00b",                       # NUL
    "/api/contracts/a%0d%0aX-Injected:%20yes",    # CR LF
    "/api/contracts/a%2fb",
    "/api/contracts/a%5cb",
    "/api/contracts/a\\b",
    "/api/contracts/%zz",
    "/api/contracts/a#b",
], ids=lambda target: target.removeprefix("/api/contracts/"))
def test_a_path_gatehouse_cannot_carry_faithfully_is_400_and_never_relayed(gatehouse, relay_doubles, warm, method, target):
    assert_400_never_relayed(gatehouse, relay_doubles, method, target, warm)


@pytest.mark.parametrize("method", ["GET", "POST"], ids=["fast", "general"])
@pytest.mark.parametrize("target", ["/api/contracts/\xff", "/api/contracts/caf\xc3\xa9", "/api/contracts/x?q=\xff"],
                         ids=["path-ff", "path-utf8", "query-ff"])
def test_raw_non_ascii_in_the_target_is_400_and_never_relayed(gatehouse, relay_doubles, warm, method, target):
    """The HTTP/1.1 parser refuses these before any relay code runs; still a problem+json 400."""
    assert_400_never_relayed(gatehouse, relay_doubles, method, target, warm)


@pytest.mark.parametrize("method", ["GET", "POST"], ids=["fast", "general"])
def test_a_pipelined_request_the_parser_refuses_never_takes_an_earlier_answers_place(gatehouse, warm, method):
    """Beyond issue 7's list, found by the property test when it pipelined: the answer to a good
    request must come before the 400 of a bad one behind it (else the app reads the 400 as the
    good request's answer)."""
    extra = [("Content-Length", "0")] if method == "POST" else []
    auth = [("Authorization", f"Bearer {warm}")] + extra
    with RawClient(gatehouse["port"]) as client:
        client.send(request(method, ROUTE + "/first", auth) + request(method, ROUTE + "/\xff", auth)
                    + request(method, ROUTE + "/third", auth))
        first = client.read_response()
        assert first is not None and first.status == 200, f"the good request was answered {first}"
        assert first.json()["path"] == BACKEND_PATH + "/first"
        second = client.read_response()
        assert second is not None and second.status == 400, second


@pytest.mark.parametrize("rest", [
    "/%21/%2A", "/%C3%A9t%C3%A9", "/x;jsessionid=1/y", "/.../a.b/.c", "/%25/%3b/%3F",
    "/!$&'()*+,=:@~", "/trailing/",
], ids=lambda rest: rest)
def test_an_accepted_path_reaches_the_backend_byte_for_byte(gatehouse, relay_doubles, relay_path, relay_token, rest):
    token = relay_token(ROUTE)
    target = ROUTE + rest + "?q=%ff&r=%41&s=/?t"
    response = send(gatehouse, "GET", target, token)
    assert response.status == 200, response
    assert response.json()["path"] == BACKEND_PATH + rest + "?q=%ff&r=%41&s=/?t"
    assert served_by(gatehouse, response) == relay_path


# =========================================================================== C. forwarding headers

#: What a client may never send a backend, because Gatehouse sets it, or because frameworks and
#: proxies read it as the client's address, the signed-in user, the original URL or the method.
FORWARDING_HEADERS = [
    "X-Forwarded-For", "X-Forwarded-Proto", "X-Forwarded-Host", "X-Forwarded-Port", "X-Forwarded-User",
    "X-Forwarded-Email", "X-Forwarded-Prefix", "X-Forwarded-Server", "X-Forwarded-Ssl", "X-Forwarded-Uri",
    "X-Forwarded-Client-Cert", "X-Forwarded", "Forwarded", "X-Real-IP", "X-Original-URL", "X-Original-URI",
    "X-Rewrite-URL", "True-Client-IP", "X-Client-IP", "Client-IP", "CF-Connecting-IP", "X-Cluster-Client-IP",
    "Fastly-Client-IP", "X-Originating-IP", "X-Remote-IP", "X-Remote-Addr", "X-Host", "X-Original-Host",
    "X-HTTP-Method-Override", "X-HTTP-Method", "X-Method-Override", "Via", "X-Request-Id", "X-Client-Request-Id",
]


def normalised(name):
    return name.lower().replace("_", "-")


def gatehouse_values(gatehouse, response):
    """The forwarding headers Gatehouse itself sets toward the backend, as the backend must see them."""
    host = urlsplit(gatehouse["url"]).netloc
    return {
        "x-forwarded-for": lambda value: value == "127.0.0.1",
        "x-forwarded-proto": lambda value: value == "http",
        "x-forwarded-host": lambda value: value == host,
        "forwarded": lambda value: value.count("for=") == 1 and "for=127.0.0.1" in value,
        "via": lambda value: value == "1.1 gatehouse",
        "x-request-id": lambda value: value == response.request_id,
    }


@pytest.mark.parametrize("name", FORWARDING_HEADERS)
def test_a_forwarding_header_from_the_client_never_reaches_the_backend(gatehouse, relay_path, relay_token, name):
    token = relay_token(ROUTE)
    # The dashed name, its underscore twin (CGI-style gateways fold X_Forwarded_User into
    # X-Forwarded-User) and an upper-case one, each with a value of its own. X-Request-Id's
    # values are not plain, so none may come back as X-Client-Request-Id either.
    variants = {name, name.replace("-", "_"), name.upper().replace("-", "_")}
    sent = {variant: f"spoof/{index}/{secrets.token_hex(4)}" for index, variant in enumerate(sorted(variants))}
    response = send(gatehouse, "GET", ROUTE + "/headers", token, list(sent.items()))
    assert response.status == 200, response
    received = response.json()["headers"]
    leaked = {key: value for key, value in received.items() if any(marker in value for marker in sent.values())}
    assert leaked == {}, f"the client's {name} reached the backend"
    own = gatehouse_values(gatehouse, response)
    for key, value in received.items():
        if normalised(key) == normalised(name):
            assert key == normalised(name) and normalised(name) in own, f"{key}: {value!r} reached the backend"
            assert own[normalised(name)](value), f"{key}: {value!r} is not Gatehouse's own"
    assert "x-client-request-id" not in received
    assert served_by(gatehouse, response) == relay_path


def test_gatehouse_sets_its_own_forwarding_headers_once_on_both_paths(gatehouse, relay_path, relay_token):
    response = send(gatehouse, "GET", ROUTE + "/own", relay_token(ROUTE))
    assert response.status == 200
    received = response.json()["headers"]
    for name, check in gatehouse_values(gatehouse, response).items():
        assert name in received and check(received[name]), (name, received.get(name))
    assert served_by(gatehouse, response) == relay_path


@pytest.mark.parametrize("route", ["/api/json", "/api/contracts"], ids=["json", "xml"])
def test_a_newline_in_an_identity_value_never_splits_a_header(gatehouse, relay_path, relay_token, route):
    """eve's identity service answers her BPId as "1000999\\r\\nX-Injected: yes"."""
    token = relay_token(route, username="eve")
    response = send(gatehouse, "GET", route + "/eve", token)
    assert response.status == 200, response
    received = response.json()["headers"]
    assert "x-injected" not in received
    assert received["x-subject"] == "eve"
    assert "\r" not in received["x-bpid"] and "\n" not in received["x-bpid"]
    assert received["x-bpid"].startswith("1000999")
    assert served_by(gatehouse, response) == relay_path


# =========================================================================== D. request ids

PLAIN_IDS = ["client-" + "a1B2.c3_d4-e5", "Z" * 64]
NOT_PLAIN_IDS = ["Z" * 65, "has space", "a/b", "<script>", "caf\xe9", "a,b"]


@pytest.mark.parametrize("client_id", PLAIN_IDS + NOT_PLAIN_IDS, ids=lambda value: f"{len(value)}:{value[:12]}")
def test_a_client_request_id_is_never_gatehouses_own(gatehouse, relay_path, relay_token, client_id):
    token = relay_token(ROUTE)
    response = send(gatehouse, "GET", ROUTE + "/ids", token, [("X-Request-Id", client_id)])
    assert response.status == 200, response
    own = response.request_id
    assert own and own != client_id
    meta = gatehouse["lines"].request(own)
    received = response.json()["headers"]
    assert received["x-request-id"] == own
    assert client_id not in gatehouse["lines"].requests, "a request was logged under the client's id"
    if client_id in PLAIN_IDS:
        assert received.get("x-client-request-id") == client_id
        assert meta.get("client_request_id") == client_id
    else:
        assert "x-client-request-id" not in received
        assert "client_request_id" not in meta
    assert not any(client_id in value for key, value in received.items() if key != "x-client-request-id")
    assert meta.get("relay") == relay_path


def test_two_requests_with_one_client_id_get_two_gatehouse_ids(gatehouse, warm):
    answers = [send(gatehouse, "GET", ROUTE + "/twice", warm, [("X-Request-Id", "same-id")]) for _ in range(2)]
    ids = [answer.request_id for answer in answers]
    assert len(set(ids)) == 2 and "same-id" not in ids


@pytest.mark.parametrize("client_id", ["plain-id-42", "not plain"])
def test_a_client_request_id_is_not_gatehouses_own_outside_the_relay(gatehouse, client_id):
    response = send(gatehouse, "GET", "/healthz", headers=[("X-Request-Id", client_id)])
    assert response.status == 200
    assert response.request_id and response.request_id != client_id
    gatehouse["lines"].request(response.request_id)
    assert client_id not in gatehouse["lines"].requests


# =========================================================================== E. framing

def assert_closed(client, what):
    assert client.wait_closed(5), f"the connection stayed open after {what}"


@pytest.mark.parametrize("method", ["GET", "POST"], ids=["fast", "general"])
def test_http11_without_host_is_400_and_closes(gatehouse, relay_doubles, warm, method):
    backend = relay_doubles["backend"]
    mark = backend.mark()
    with RawClient(gatehouse["port"]) as client:
        client.send(request(method, ROUTE + "/no-host", [("Authorization", f"Bearer {warm}")], host=None))
        problem(client.read_response(), 400, "bad_request")
        assert_closed(client, "a request without Host")
    assert backend.request_lines_since(mark) == []


def test_http11_without_host_is_400_outside_the_relay_too(gatehouse):
    with RawClient(gatehouse["port"]) as client:
        client.send(request("GET", "/healthz", host=None))
        problem(client.read_response(), 400, "bad_request")
        assert_closed(client, "a request without Host")


def test_http10_without_host_is_still_served(gatehouse):
    with RawClient(gatehouse["port"]) as client:
        response = client.exchange(request("GET", "/healthz", version="HTTP/1.0", host=None))
        assert response.status == 200, response


@pytest.mark.parametrize("method, path", [("GET", ROUTE + "/two-hosts"), ("POST", ROUTE + "/two-hosts"), ("GET", "/healthz")],
                         ids=["fast", "general", "healthz"])
def test_two_host_headers_are_400_and_close(gatehouse, relay_doubles, warm, method, path):
    backend = relay_doubles["backend"]
    mark = backend.mark()
    with RawClient(gatehouse["port"]) as client:
        client.send(request(method, path, [("Authorization", f"Bearer {warm}"), ("Host", "other.test")], host="gatehouse.test"))
        problem(client.read_response(), 400, "bad_request")
        assert_closed(client, "two Host headers")
    assert backend.request_lines_since(mark) == []


def test_a_transfer_coding_other_than_chunked_is_501_and_never_relayed(gatehouse, relay_doubles, warm):
    backend = relay_doubles["backend"]
    mark, calls = backend.mark(), backend.calls
    with RawClient(gatehouse["port"]) as client:
        client.send(request("POST", ROUTE + "/gzip", [("Authorization", f"Bearer {warm}"), ("Transfer-Encoding", "gzip, chunked")],
                            b"5\r\nhello\r\n0\r\n\r\n", length=False))
        problem(client.read_response(), 501, "not_implemented")
        assert_closed(client, "a 501")
    assert backend.request_lines_since(mark) == [] and backend.calls == calls


@pytest.mark.parametrize("method", ["GET", "POST"], ids=["fast", "general"])
def test_an_expectation_other_than_100_continue_is_417(gatehouse, relay_doubles, warm, method):
    backend = relay_doubles["backend"]
    mark = backend.mark()
    body = b"hello" if method == "POST" else b""
    with RawClient(gatehouse["port"]) as client:
        client.send(request(method, ROUTE + "/expect", [("Authorization", f"Bearer {warm}"), ("Expect", "something-else")], body))
        problem(client.read_response(), 417, "expectation_failed")
        assert_closed(client, "a 417")
    assert backend.request_lines_since(mark) == []


@pytest.mark.parametrize("route", [ROUTE, "/api/small"], ids=["streamed", "buffered"])
@pytest.mark.parametrize("body", [
    b"zz\r\nhello\r\n0\r\n\r\n",                   # a chunk size that is not hex
    b"5\r\nhello\r\nzz\r\nworld\r\n0\r\n\r\n",     # ... after a good chunk
    b"5\r\nhelloXX\r\n0\r\n\r\n",                  # chunk data not followed by CRLF
    b"-5\r\nhello\r\n0\r\n\r\n",                   # a negative size
], ids=["bad-size", "bad-second-size", "no-crlf", "negative"])
def test_malformed_chunked_framing_is_the_clients_400_not_a_backend_failure(gatehouse, relay_doubles, warm, route, body):
    lines = gatehouse["lines"]
    backend = relay_doubles["backend"]
    mark, backend_mark = lines.mark(), backend.mark()
    with RawClient(gatehouse["port"]) as client:
        client.send(request("POST", route + "/chunks", [("Authorization", f"Bearer {warm}"), ("Transfer-Encoding", "chunked")],
                            body, length=False))
        try:
            answer = client.read_response()
        except EOFError:
            answer = None
        if answer is not None:
            problem(answer, 400, "bad_request")
        assert_closed(client, "malformed chunked framing")
    # A request after it has been logged, so a "backend unavailable" line for this one would be too.
    sentinel = send(gatehouse, "GET", "/healthz")
    lines.request(sentinel.request_id)
    failures = [line for line in lines.lines_since(mark) if "backend unavailable" in line or "status=502" in line]
    assert failures == []
    if route == "/api/small":  # a buffered body is checked whole before anything is sent
        assert backend.request_lines_since(backend_mark) == []


def chunked(data, size):
    return b"".join(b"%x\r\n%s\r\n" % (len(data[i:i + size]), data[i:i + size]) for i in range(0, len(data), size)) + b"0\r\n\r\n"


def test_a_chunked_body_over_the_routes_limit_is_413_and_nothing_reaches_the_backend(gatehouse, relay_doubles, tokens):
    token = tokens.warm("/api/small")
    backend = relay_doubles["backend"]
    mark, calls = backend.mark(), backend.calls
    with RawClient(gatehouse["port"]) as client:
        client.send(request("POST", "/api/small/too-big", [("Authorization", f"Bearer {token}"), ("Transfer-Encoding", "chunked")],
                            chunked(b"x" * 2048, 256), length=False))
        problem(client.read_response(), 413, "payload_too_large")
    assert backend.calls == calls and backend.request_lines_since(mark) == []


def test_a_chunked_body_within_the_limit_of_a_buffering_route_arrives_whole(gatehouse, tokens):
    token = tokens.warm("/api/small")
    data = bytes(range(256)) * 4  # 1024 bytes: exactly the limit
    with RawClient(gatehouse["port"]) as client:
        response = client.exchange(request("POST", "/api/small/fits", [("Authorization", f"Bearer {token}"), ("Transfer-Encoding", "chunked")],
                                           chunked(data, 100), length=False))
    assert response.status == 200, response
    assert response.json()["body_bytes"] == 1024
    assert response.json()["body_sha256"] == hashlib.sha256(data).hexdigest()


def send_after_100_continue(gatehouse, path, headers, body):
    """Sends the head with `Expect: 100-continue`, the body only once `100 Continue` came; the final answer."""
    with RawClient(gatehouse["port"]) as client:
        client.send(request("POST", path, headers + [("Expect", "100-continue"), ("Content-Length", str(len(body)))]))
        interim = client.read_response(interim=True, timeout=10)
        assert interim is not None and interim.status == 100, interim
        client.send(body)
        return client.read_response()


@pytest.mark.parametrize("freshness", ["fresh", "warm"])
def test_expect_100_continue_is_answered_before_the_body_is_sent(gatehouse, tokens, freshness):
    token = tokens.fresh() if freshness == "fresh" else tokens.warm(ROUTE)
    body = b"hello world"
    response = send_after_100_continue(gatehouse, ROUTE + "/continue", [("Authorization", f"Bearer {token}")], body)
    assert response.status == 200, response
    echoed = response.json()
    assert echoed["body_bytes"] == len(body) and echoed["method"] == "POST"
    assert "expect" not in echoed["headers"]
    assert served_by(gatehouse, response) == "general"


def test_expect_100_continue_with_an_invalid_token_is_401_without_continue(gatehouse, relay_doubles):
    backend = relay_doubles["backend"]
    mark = backend.mark()
    with RawClient(gatehouse["port"]) as client:
        client.send(request("POST", ROUTE + "/continue", [("Authorization", "Bearer not-a-real-token-" + secrets.token_hex(8)),
                                                           ("Expect", "100-continue"), ("Content-Length", "1000000")]))
        answer = client.read_response(interim=True, timeout=10)  # the body is never sent
    problem(answer, 401, "invalid_token")
    assert backend.request_lines_since(mark) == []


def test_expect_100_continue_at_the_token_endpoint(gatehouse):
    body = b"grant_type=unheard_of&client_id=com.example.app"
    response = send_after_100_continue(gatehouse, "/oauth/token", [("Content-Type", "application/x-www-form-urlencoded")], body)
    assert response.status == 400, response
    assert "error" in response.json()


# =========================================================================== G. relay-wiring state at the callback

@pytest.mark.parametrize("callback", ["code", "error"])
def test_a_relay_wiring_state_at_the_callback_is_refused_without_being_consumed(gatehouse, seen, callback):
    app = App(gatehouse, seen, client_id="com.example.relay")
    received = app.sign_in()  # the upstream sent the browser straight to the app, with Gatehouse's state
    query = {"code": {"code": received["code"], "state": received["state"]},
             "error": {"error": "access_denied", "state": received["state"]}}[callback]
    answer = requests.get(gatehouse["url"] + "/oauth/callback", params=query, allow_redirects=False, timeout=10)
    assert answer.status_code == 400, answer.text
    assert "Location" not in answer.headers
    assert answer.json()["code"] == "unknown_state"
    tokens = app.redeem(received["code"], state=received["state"])
    assert tokens.status_code == 200, tokens.text
    assert tokens.json()["access_token"]
