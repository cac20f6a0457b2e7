"""What the tests of modern upstreams share (sandbox/modern: private_key_jwt, mutual TLS, PAR): the
keys and certificates they are made of, the double's config, the reading of its wire log, and the
JOSE helpers to check what Gatehouse sent. The double itself is started by sandbox.modern.run.

    pki = Pki(workdir / "modern-pki")        # made once per directory with `cryptography`
    pki.server_ca, pki.server_cert, pki.server_key    # the double's HTTPS (127.0.0.1 as IP SAN)
    pki.client_ca, pki.client_cert, pki.client_key    # tls_client_auth (CLIENT_DN, issued by client_ca)
    pki.self_signed_cert, pki.self_signed_key         # self_signed_tls_client_auth
    pki.untrusted_cert, pki.untrusted_key             # issued by a CA nobody trusts, subject CLIENT_DN
    pki.rsa_key, pki.rsa_key_2, pki.ec_key, pki.ec_key_2, pki.stranger_ec_key   # PKCS#8 PEM
    pki.jwk(path) / pki.jwks(*paths)                  # their public JWKs, RFC 7638 kid
    pki.certificate_jwk(path)                         # a certificate as a JWK with x5c
    pki.record(seen)                                  # every private key into the secrets record

    with sandbox.modern.run(workdir, "modern-x", config) as double:
        double["url"], double["mtls_url"], double["log"]()   # log(since=N): the wire log
"""

import base64
import datetime
import hashlib
import ipaddress
import json
import re
import secrets
import time
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID

CLIENT_DN = "CN=gatehouse-mtls,O=Gatehouse Tests"
ASSERTION_TYPE = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def b64url_json(segment):
    return json.loads(base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4)))


def thumbprint(jwk):
    """RFC 7638 §3: SHA-256 of the required members in lexical order, no white space."""
    required = ["crv", "kty", "x", "y"] if jwk["kty"] == "EC" else ["e", "kty", "n"]
    canonical = json.dumps({name: jwk[name] for name in required}, separators=(",", ":"), sort_keys=True)
    return b64url(hashlib.sha256(canonical.encode()).digest())


def public_jwk(public_key):
    if isinstance(public_key, ec.EllipticCurvePublicKey):
        numbers = public_key.public_numbers()
        jwk = {"kty": "EC", "crv": "P-256", "x": b64url(numbers.x.to_bytes(32, "big")), "y": b64url(numbers.y.to_bytes(32, "big"))}
    else:
        numbers = public_key.public_numbers()
        jwk = {"kty": "RSA", "n": b64url(numbers.n.to_bytes((numbers.n.bit_length() + 7) // 8, "big")),
               "e": b64url(numbers.e.to_bytes((numbers.e.bit_length() + 7) // 8, "big"))}
    jwk["kid"] = thumbprint(jwk)
    return jwk


def certificate_thumbprint(path):
    """x5t#S256 of the (first) certificate of a PEM file."""
    certificate = x509.load_pem_x509_certificate(Path(path).read_bytes())
    return b64url(hashlib.sha256(certificate.public_bytes(serialization.Encoding.DER)).digest())


def _name(text):
    return x509.Name.from_rfc4514_string(text)


def _pem_key(key):
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def _certificate(subject, issuer, public_key, signing_key, ca=False, server_ip=None, client=False, days=2):
    current = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=5)
    builder = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(_name(issuer)).public_key(public_key)
               .serial_number(x509.random_serial_number()).not_valid_before(current)
               .not_valid_after(current + datetime.timedelta(days=days))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ca:
        builder = builder.add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                                      data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                                      crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
    if server_ip:
        builder = (builder.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(server_ip))]), critical=False)
                   .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False))
    if client:
        builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    return builder.sign(signing_key, hashes.SHA256())


class Pki:
    """Every key and certificate of the modern-upstream tests, as files in `directory`."""

    def __init__(self, directory):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        d = self.directory
        self.rsa_key, self.rsa_key_2 = d / "assertion-rsa.pem", d / "assertion-rsa-2.pem"
        self.ec_key, self.ec_key_2, self.stranger_ec_key = d / "assertion-ec.pem", d / "assertion-ec-2.pem", d / "stranger-ec.pem"
        self.server_ca, self.server_cert, self.server_key = d / "server-ca.pem", d / "server.pem", d / "server-key.pem"
        self.client_ca, self.client_cert, self.client_key = d / "client-ca.pem", d / "client.pem", d / "client-key.pem"
        self.self_signed_cert, self.self_signed_key = d / "self-signed.pem", d / "self-signed-key.pem"
        self.untrusted_cert, self.untrusted_key = d / "untrusted.pem", d / "untrusted-key.pem"
        self.own_keys, self.seen = [], None
        if not self.untrusted_key.exists():
            self._make()

    def assertion_key(self, upstream, kind="ec"):
        """A client-assertion key of `upstream`'s own (Gatehouse refuses one key under two upstreams):
        a P-256 (`ec`) or RSA 2048 (`rsa`) key made on first use, in the run's secrets once recorded."""
        path = self.directory / f"assertion-{upstream}-{kind}.pem"
        if not path.exists():
            key = ec.generate_private_key(ec.SECP256R1()) if kind == "ec" else rsa.generate_private_key(public_exponent=65537, key_size=2048)
            path.write_bytes(_pem_key(key))
        if path not in self.own_keys:
            self.own_keys.append(path)
            if self.seen is not None:
                self.record_key(path, self.seen)
        return path

    def _make(self):
        for path in (self.rsa_key, self.rsa_key_2):
            path.write_bytes(_pem_key(rsa.generate_private_key(public_exponent=65537, key_size=2048)))
        for path in (self.ec_key, self.ec_key_2, self.stranger_ec_key):
            path.write_bytes(_pem_key(ec.generate_private_key(ec.SECP256R1())))

        def ca(subject):
            key = ec.generate_private_key(ec.SECP256R1())
            return key, _certificate(subject, subject, key.public_key(), key, ca=True)

        def write(cert_path, key_path, certificate, key):
            cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
            if key_path is not None:
                key_path.write_bytes(_pem_key(key))

        server_ca_key, server_ca = ca("CN=Modern Upstream Test Server CA,O=Gatehouse Tests")
        write(self.server_ca, None, server_ca, None)
        server_key = ec.generate_private_key(ec.SECP256R1())
        write(self.server_cert, self.server_key,
              _certificate("CN=127.0.0.1", server_ca.subject.rfc4514_string(), server_key.public_key(), server_ca_key,
                           server_ip="127.0.0.1"), server_key)
        client_ca_key, client_ca = ca("CN=Modern Upstream Test Client CA,O=Gatehouse Tests")
        write(self.client_ca, None, client_ca, None)
        client_key = ec.generate_private_key(ec.SECP256R1())
        write(self.client_cert, self.client_key,
              _certificate(CLIENT_DN, client_ca.subject.rfc4514_string(), client_key.public_key(), client_ca_key, client=True), client_key)
        self_key = ec.generate_private_key(ec.SECP256R1())
        subject = "CN=gatehouse-self-signed,O=Gatehouse Tests"
        write(self.self_signed_cert, self.self_signed_key,
              _certificate(subject, subject, self_key.public_key(), self_key, client=True), self_key)
        rogue_key, rogue_ca = ca("CN=Nobody Trusts This CA")
        untrusted_key = ec.generate_private_key(ec.SECP256R1())
        write(self.untrusted_cert, self.untrusted_key,
              _certificate(CLIENT_DN, rogue_ca.subject.rfc4514_string(), untrusted_key.public_key(), rogue_key, client=True), untrusted_key)

    def private_keys(self):
        return [self.rsa_key, self.rsa_key_2, self.ec_key, self.ec_key_2, self.stranger_ec_key, self.server_key,
                self.client_key, self.self_signed_key, self.untrusted_key, *self.own_keys]

    @classmethod
    def recorded(cls, directory, seen):
        """A new set of keys and certificates in `directory`, its private keys in the run's secrets."""
        pki = cls(directory)
        pki.record(seen)
        return pki

    def record(self, seen):
        """Every private key into the run's secrets (and every key made later): its PEM, its base64
        body, its DER's base64."""
        self.seen = seen
        for path in self.private_keys():
            self.record_key(path, seen)

    @staticmethod
    def record_key(path, seen):
        pem = path.read_text()
        body = "".join(line for line in pem.splitlines() if not line.startswith("-----"))
        seen.add(pem, kind="private key PEM")
        seen.add(body, kind="private key (base64 body)")
        for line in pem.splitlines():
            if len(line) >= 24 and not line.startswith("-----"):
                seen.add(line, kind="private key (PEM line)")

    @staticmethod
    def private(path):
        return serialization.load_pem_private_key(Path(path).read_bytes(), password=None)

    def jwk(self, path, **extra):
        return {**public_jwk(self.private(path).public_key()), **extra}

    def jwks(self, *paths):
        return {"keys": [self.jwk(path) for path in paths]}

    @staticmethod
    def certificate_jwk(path):
        certificate = x509.load_pem_x509_certificate(Path(path).read_bytes())
        jwk = public_jwk(certificate.public_key())
        jwk["x5c"] = [base64.b64encode(certificate.public_bytes(serialization.Encoding.DER)).decode()]
        return jwk


def double_config(pki, clients, **options):
    """The double's config: its server certificate, the client CA, the self-signed certificate as a
    TLS trust anchor, `clients` and `options` (require_pushed_authorization_requests…)."""
    return {"server_certificate": str(pki.server_cert), "server_key": str(pki.server_key),
            "client_ca_file": str(pki.client_ca), "trusted_self_signed_certificates": [str(pki.self_signed_cert)],
            "user": {"sub": "alice-modern-7", "name": "Alice Liddell", "given_name": "Alice", "family_name": "Liddell",
                     "email": "alice@example.test"},
            "clients": clients, **options}


def entries(log, endpoint=None, client_id=None, **match):
    """The log entries of `endpoint` (token, par, revocation, userinfo, authorize, tls-handshake)
    of `client_id`, whose fields equal `match`."""
    return [entry for entry in log
            if (endpoint is None or entry.get("endpoint") == endpoint)
            and (client_id is None or entry.get("client_id") == client_id)
            and all(entry.get(key) == value for key, value in match.items())]


def assertion_checks(entry, client_id, audience, kid, lifetime=60, algorithm=None):
    """Problems with the client assertion an entry records (an empty list when it is right):
    iss = sub = client_id, aud, kid, exp - iat within `lifetime`, a jti, the alg."""
    problems = []
    assertion = entry.get("client_assertion") or {}
    header, claims = assertion.get("header") or {}, assertion.get("claims") or {}
    if entry.get("client_auth") != "private_key_jwt":
        problems.append(f"client_auth {entry.get('client_auth')!r}")
    if claims.get("iss") != client_id or claims.get("sub") != client_id:
        problems.append(f"iss/sub {claims.get('iss')!r}/{claims.get('sub')!r}")
    if claims.get("aud") not in (audience, [audience]):
        problems.append(f"aud {claims.get('aud')!r}, expected {audience!r}")
    if header.get("kid") != kid:
        problems.append(f"kid {header.get('kid')!r}, expected {kid!r}")
    if algorithm and header.get("alg") != algorithm:
        problems.append(f"alg {header.get('alg')!r}, expected {algorithm!r}")
    if not isinstance(claims.get("jti"), str) or len(claims.get("jti", "")) < 16:
        problems.append("no jti of 16 characters or more")
    iat, exp = claims.get("iat"), claims.get("exp")
    if not isinstance(iat, int) or not isinstance(exp, int) or not 0 < exp - iat <= lifetime:
        problems.append(f"exp - iat = {exp} - {iat}, expected within (0, {lifetime}]")
    elif abs(iat - time.time()) > 30:
        problems.append(f"iat {iat} is not now")
    return problems


def sign_assertion(pki, key_path, client_id, audience, kid=None, alg=None, lifetime=60, iat=None, jti=None, **claims):
    """A client assertion signed with `key_path` (joserfc), for the double's own tests."""
    from joserfc import jwt
    from joserfc.jwk import import_key
    private = pki.private(key_path)
    key = import_key(Path(key_path).read_text(), "EC" if isinstance(private, ec.EllipticCurvePrivateKey) else "RSA")
    alg = alg or ("ES256" if isinstance(private, ec.EllipticCurvePrivateKey) else "RS256")
    issued = int(time.time()) if iat is None else iat
    body = {"iss": client_id, "sub": client_id, "aud": audience, "iat": issued, "exp": issued + lifetime,
            "jti": jti or secrets.token_urlsafe(24), **claims}
    header = {"alg": alg, "typ": "JWT", "kid": kid or pki.jwk(key_path)["kid"]}
    return jwt.encode(header, body, key, algorithms=[alg])


def pem_body(path):
    return re.sub(r"-----[^-]+-----|\s", "", Path(path).read_text())
