"""What a device sends to attest itself, built the way the device builds it, from Apple's and
Google's published formats (cbor2 + cryptography; nothing of Gatehouse's code):

* Apple App Attest ("Validating apps that connect to your server"): an attestation object, CBOR
  {fmt: "apple-appattest", attStmt: {x5c: [credential certificate, intermediate], receipt},
  authData}, where authData is WebAuthn's (RP id hash, flags, counter, aaguid, credential id,
  COSE key) and the credential certificate carries SHA-256(authData ‖ clientDataHash) in the
  extension 1.2.840.113635.100.8.2; and assertions, CBOR {signature, authenticatorData}. The
  certificates chain to a test root (`AppleAuthority`), standing in for Apple's.
* Google Play Integrity (local decryption and verification): a JWE (A256KW + A256GCM) around a
  JWS (ES256) around the verdict JSON, with test keys standing in for the Play Console's.
"""

import base64
import datetime
import hashlib
import json
import os
import time

import cbor2
import jwt
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.keywrap import aes_key_wrap
from cryptography.hazmat.primitives.serialization import pkcs7
from cryptography.x509.oid import NameOID

NONCE_OID = x509.ObjectIdentifier("1.2.840.113635.100.8.2")
PRODUCTION = b"appattest" + b"\x00" * 7
# Apple's published sample attestation objects carry a receipt of about 3.7 KB: the whole object is
# some 5.5 KB, about 7,400 characters of base64.
RECEIPT_SIZE = 3700
DEVELOPMENT = b"appattestdevelop"


def b64(data):
    return base64.b64encode(data).decode()


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _name(common_name):
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name), x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Test")])


def _certificate(subject, issuer, public_key, signing_key, ca, extensions=()):
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(public_key)
               .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
               .not_valid_after(now + datetime.timedelta(days=30))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ca:
        builder = builder.add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                                      data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                                      crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
    for extension in extensions:
        builder = builder.add_extension(extension, critical=False)
    return builder.sign(signing_key, hashes.SHA256() if isinstance(signing_key, ec.EllipticCurvePrivateKey) and
                        signing_key.curve.name == "secp256r1" else hashes.SHA384())


class AppleAuthority:
    """A root and an intermediate CA, as Apple's App Attestation Root CA and its intermediate."""

    def __init__(self, name="Test App Attestation Root CA"):
        self.root_key = ec.generate_private_key(ec.SECP384R1())
        self.root = _certificate(_name(name), _name(name), self.root_key.public_key(), self.root_key, ca=True)
        self.intermediate_key = ec.generate_private_key(ec.SECP384R1())
        self.intermediate = _certificate(_name("Test App Attestation CA 1"), _name(name), self.intermediate_key.public_key(),
                                         self.root_key, ca=True)

    def write_root(self, path):
        path.write_bytes(self.root.public_bytes(serialization.Encoding.PEM))
        return path

    def credential_certificate(self, public_key, nonce):
        # SEQUENCE { [1] EXPLICIT OCTET STRING nonce }, as Apple's credential certificates carry it.
        octets = b"\x04" + bytes([len(nonce)]) + nonce
        tagged = b"\xa1" + bytes([len(octets)]) + octets
        value = b"\x30" + bytes([len(tagged)]) + tagged
        return _certificate(_name("credential"), self.intermediate.subject, public_key, self.intermediate_key, ca=False,
                            extensions=[x509.UnrecognizedExtension(NONCE_OID, value)])


class DeviceKey:
    """An App Attest key in a device's Secure Enclave: P-256; its key id is the SHA-256 of its public key."""

    def __init__(self):
        self.private = ec.generate_private_key(ec.SECP256R1())
        self.public_bytes = self.private.public_key().public_bytes(serialization.Encoding.X962,
                                                                   serialization.PublicFormat.UncompressedPoint)
        self.key_id = hashlib.sha256(self.public_bytes).digest()

    def cose_key(self):
        return cbor2.dumps({1: 2, 3: -7, -1: 1, -2: self.public_bytes[1:33], -3: self.public_bytes[33:]})


def client_data_hash(challenge):
    """The app attests with clientDataHash = SHA-256 of the challenge's UTF-8 bytes (Gatehouse's convention)."""
    return hashlib.sha256(challenge.encode()).digest()


def _der(tag, content):
    length = len(content)
    if length < 0x80:
        return bytes([tag, length]) + content
    encoded = length.to_bytes((length.bit_length() + 7) // 8, "big")
    return bytes([tag, 0x80 | len(encoded)]) + encoded + content


def receipt(authority, size=RECEIPT_SIZE):
    """A receipt shaped as Apple's: a PKCS #7 SignedData (DER) over the receipt's attributes (an
    ASN.1 SET), with its signing certificate and the intermediate, `size` bytes long (about)."""
    key = ec.generate_private_key(ec.SECP256R1())
    signer = _certificate(_name("Test Receipt Signing"), authority.intermediate.subject, key.public_key(), authority.intermediate_key,
                          ca=False)

    def build(payload):
        return (pkcs7.PKCS7SignatureBuilder().set_data(payload).add_signer(signer, key, hashes.SHA256())
                .add_certificate(authority.intermediate).sign(serialization.Encoding.DER, [pkcs7.PKCS7Options.Binary]))

    bare = build(_der(0x31, b""))
    return build(_der(0x31, _der(0x04, os.urandom(max(0, size - len(bare) - 8)))))


def attest(authority, key, challenge, app_id, aaguid=PRODUCTION, counter=0, nonce=None, key_id=None, receipt_size=RECEIPT_SIZE):
    """(key_id base64, attestation object base64), as DCAppAttestService.attestKey gives them."""
    key_id = key.key_id if key_id is None else key_id
    auth_data = (hashlib.sha256(app_id.encode()).digest() + bytes([0x40]) + counter.to_bytes(4, "big") + aaguid
                 + len(key.key_id).to_bytes(2, "big") + key.key_id + key.cose_key())
    nonce = hashlib.sha256(auth_data + client_data_hash(challenge)).digest() if nonce is None else nonce
    leaf = authority.credential_certificate(key.private.public_key(), nonce)
    statement = {"x5c": [leaf.public_bytes(serialization.Encoding.DER), authority.intermediate.public_bytes(serialization.Encoding.DER)],
                 "receipt": receipt(authority, receipt_size)}
    obj = cbor2.dumps({"fmt": "apple-appattest", "attStmt": statement, "authData": auth_data})
    return b64(key_id), b64(obj)


def assertion(key, challenge, app_id, counter):
    """An assertion as DCAppAttestService.generateAssertion gives it: the key signs SHA-256(authenticatorData ‖ clientDataHash)."""
    authenticator_data = hashlib.sha256(app_id.encode()).digest() + bytes([0x40]) + counter.to_bytes(4, "big")
    nonce = hashlib.sha256(authenticator_data + client_data_hash(challenge)).digest()
    signature = key.private.sign(nonce, ec.ECDSA(hashes.SHA256()))
    return b64(cbor2.dumps({"signature": signature, "authenticatorData": authenticator_data}))


class PlayKeys:
    """The two keys of the Play Console's "manage your own response encryption keys": a 32-byte
    AES decryption key and an EC P-256 verification key, written base64 as the console gives them."""

    def __init__(self):
        self.decryption = os.urandom(32)
        self.signing = ec.generate_private_key(ec.SECP256R1())

    def write(self, directory, name):
        decryption, verification = directory / f"{name}-decryption.txt", directory / f"{name}-verification.txt"
        decryption.write_text(b64(self.decryption) + "\n")
        verification.write_text(b64(self.signing.public_key().public_bytes(serialization.Encoding.DER,
                                                                           serialization.PublicFormat.SubjectPublicKeyInfo)) + "\n")
        return decryption, verification


def verdict(nonce, package, app_verdict="PLAY_RECOGNIZED", device=("MEETS_DEVICE_INTEGRITY",), timestamp_ms=None,
            app_package=None):
    return {
        "requestDetails": {"requestPackageName": package, "nonce": nonce,
                           "timestampMillis": str(int(time.time() * 1000) if timestamp_ms is None else timestamp_ms)},
        "appIntegrity": {"appRecognitionVerdict": app_verdict, "packageName": app_package or package,
                         "certificateSha256Digest": [b64url(os.urandom(32))], "versionCode": "42"},
        "deviceIntegrity": {"deviceRecognitionVerdict": list(device)},
        "accountDetails": {"appLicensingVerdict": "LICENSED"},
    }


def integrity_token(keys, payload, signing_key=None, enc_header=None):
    """The Play Integrity token: JWS ES256 of the verdict, in a JWE A256KW + A256GCM."""
    jws = jwt.encode(payload, signing_key or keys.signing, algorithm="ES256")
    header = b64url(json.dumps(enc_header or {"alg": "A256KW", "enc": "A256GCM"}, separators=(",", ":")).encode())
    content_key, iv = os.urandom(32), os.urandom(12)
    sealed = AESGCM(content_key).encrypt(iv, jws.encode(), header.encode())
    wrapped = aes_key_wrap(keys.decryption, content_key)
    return ".".join([header, b64url(wrapped), b64url(iv), b64url(sealed[:-16]), b64url(sealed[-16:])])
