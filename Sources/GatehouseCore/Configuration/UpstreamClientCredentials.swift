import _CryptoExtras
import Crypto
public import Foundation
import SwiftASN1
import X509

// What Gatehouse proves itself to an upstream with, beyond a shared secret: keys that sign client
// assertions (RFC 7523 §2.2, `private_key_jwt`) and a client certificate (RFC 8705). Read and
// checked once, when the configuration is, so a key that cannot sign is a configuration problem
// with its YAML path and line, never a failed sign-in later.

extension ClientAuthentication {
    /// Whether the method sends the client secret (and so needs one).
    public var usesSecret: Bool { self == .clientSecretBasic || self == .clientSecretPost }
    /// Whether the method is a client certificate on the TLS connection (RFC 8705 §2).
    public var usesCertificate: Bool { self == .tlsClientAuth || self == .selfSignedTLSClientAuth }
}

/// `client_assertion`: the keys of `private_key_jwt` and the claims their assertions carry.
public struct ClientAssertionSettings: Sendable {
    /// The first signs; every one is published (`/upstreams/<name>/jwks.json`), so an upstream that
    /// reads the client's keys from that URL accepts the next key before it is first used.
    public var keys: [ClientAssertionKey]
    /// What the assertion's `aud` names.
    public var audience: ClientAssertionAudience
    /// `exp` minus `iat`.
    public var lifetime: Duration

    public init(keys: [ClientAssertionKey], audience: ClientAssertionAudience = .issuer, lifetime: Duration = .seconds(60)) {
        precondition(!keys.isEmpty, "a client assertion needs a key to sign with")
        self.keys = keys
        self.audience = audience
        self.lifetime = lifetime
    }
}

/// The `aud` of a client assertion: the upstream's issuer identifier (RFC 7523bis, FAPI 2.0), the
/// URL of the endpoint the assertion is posted to (what idpyoidc checks at each endpoint), the token
/// endpoint's URL at the token endpoint (OpenID Connect Core §9, what older servers compare with),
/// or a URL given.
public enum ClientAssertionAudience: Sendable, Equatable {
    case issuer
    case endpoint
    case tokenEndpoint
    case url(String)

    /// The `aud` of an assertion posted to `url`, where `tokenEndpoint` is the upstream's token
    /// endpoint (`nil` when not known yet) and `issuer` its issuer identifier (`nil` for a plain
    /// OAuth 2.0 server).
    ///
    /// An assertion naming the token endpoint is good for tokens there, so it is never posted
    /// anywhere else (the audience-injection class: a PAR, revocation or introspection endpoint,
    /// named by discovery and possibly another host, could replay it at the token endpoint): where
    /// the token endpoint would be named elsewhere, the endpoint's own URL is.
    public func audience(postedTo url: String, tokenEndpoint: String?, issuer: String?) -> String {
        switch self {
        case .endpoint, .tokenEndpoint: url
        case .issuer: issuer ?? url
        case .url(let configured): configured == tokenEndpoint && url != tokenEndpoint ? url : configured
        }
    }
}

/// The JWS algorithms a client assertion can be signed with.
public enum ClientAssertionAlgorithm: String, Sendable, CaseIterable {
    case rs256 = "RS256"
    case ps256 = "PS256"
    case es256 = "ES256"
}

/// One key of `client_assertion.keys`: the private key (never logged, never published) and its
/// public JWK with its `kid`.
public struct ClientAssertionKey: Sendable {
    enum Private: Sendable {
        case rsa(_RSA.Signing.PrivateKey)
        case p256(P256.Signing.PrivateKey)
    }

    let key: Private
    public let algorithm: ClientAssertionAlgorithm
    /// The JWS `kid`: configured, or the RFC 7638 thumbprint of the public key.
    public let keyID: String
    /// The RFC 7638 thumbprint of the public key, whatever `keyID` is.
    public let thumbprint: String
    /// The public key as a JWK (`kty`, `use`, `alg`, `kid` and its public parameters only).
    public let publicJWK: [String: String]

    /// Reads a PEM private key (PKCS#8, SEC 1 or PKCS#1; other blocks in the file, such as
    /// `EC PARAMETERS` or a certificate, are skipped). A P-256 key signs ES256; an RSA key signs
    /// `algorithm` (RS256 or PS256; RS256 when `nil`). Throws a sentence for the configuration problem.
    public init(pem: String, algorithm: ClientAssertionAlgorithm?, keyID: String?) throws(ClientCredentialError) {
        let pem = Self.privateKeyBlock(in: pem) ?? pem
        if let key = try? P256.Signing.PrivateKey(pemRepresentation: pem) {
            self.key = .p256(key)
            self.algorithm = .es256
        } else if let key = try? _RSA.Signing.PrivateKey(unsafePEMRepresentation: pem) {
            guard key.keySizeInBits >= 2048 else {
                throw ClientCredentialError("is a \(key.keySizeInBits)-bit RSA key: at least 2048 bits are required (RFC 7518 §3.3)")
            }
            guard algorithm != .es256 else { throw ClientCredentialError("is an RSA key, which signs RS256 or PS256 (algorithm), not ES256") }
            self.key = .rsa(key)
            self.algorithm = algorithm ?? .rs256
        } else {
            throw ClientCredentialError("holds no PEM private key that can be read (an RSA key of 2048 bits or more, or a P-256 key)")
        }
        guard var jwk = Self.publicParameters(of: self.key), let thumbprint = JSONWebKey.thumbprint(of: jwk) else {
            throw ClientCredentialError("holds an RSA key whose public parameters cannot be read")
        }
        self.thumbprint = thumbprint
        self.keyID = keyID ?? thumbprint
        jwk["kid"] = self.keyID
        jwk["use"] = "sig"
        jwk["alg"] = self.algorithm.rawValue
        self.publicJWK = jwk
    }

    /// The JWS signature of `input` (the signing input, `header.payload`).
    public func sign(_ input: Data) throws -> Data {
        switch (key, algorithm) {
        case (.p256(let key), _):
            return try key.signature(for: input).rawRepresentation
        case (.rsa(let key), .ps256):
            return try key.signature(for: input, padding: .PSS).rawRepresentation
        case (.rsa(let key), _):
            return try key.signature(for: input, padding: .insecurePKCS1v1_5).rawRepresentation
        }
    }

    /// The required public members of the key's JWK (RFC 7518 §6.2.1, §6.3.1).
    private static func publicParameters(of key: Private) -> [String: String]? {
        switch key {
        case .p256(let key):
            return JSONWebKey.ecParameters(curve: "P-256", point: key.publicKey.x963Representation)
        case .rsa(let key):
            guard let primitives = try? key.publicKey.getKeyPrimitives() else { return nil }
            return JSONWebKey.rsaParameters(modulus: primitives.modulus, exponent: primitives.publicExponent)
        }
    }

    /// The private-key block of a PEM file that may hold others (`EC PARAMETERS`, certificates).
    static func privateKeyBlock(in pem: String) -> String? {
        guard let documents = try? PEMDocument.parseMultiple(pemString: pem) else { return nil }
        return documents.first { ["PRIVATE KEY", "EC PRIVATE KEY", "RSA PRIVATE KEY"].contains($0.discriminator) }?.pemString
    }
}

/// `client_certificate`: the certificate (and its chain) and key of `tls_client_auth` and
/// `self_signed_tls_client_auth`, presented on every TLS connection to the upstream.
public struct ClientCertificate: Sendable {
    /// The PEM certificates, the client's first.
    public let certificatePEM: String
    public let keyPEM: Secret
    /// The client certificate's public key as a JWK (RSA, P-256 or P-384; `nil` for another key);
    /// published with `x5c` (RFC 8705 §2.2: how a self-signed certificate is registered) for
    /// upstreams that read it from a `jwks_uri`.
    public let publicJWK: [String: String]?
    /// The client certificate, base64 DER: the `x5c` of its JWK (RFC 7517 §4.7).
    public let certificateBase64: String
    /// The certificate's validity: outside it the upstream refuses it, which Gatehouse warns of
    /// (`UpstreamHTTP`) rather than refusing to start: an expired certificate stops one upstream,
    /// not every app of the gateway.
    public let notValidBefore: Date
    public let notValidAfter: Date

    /// Checks that the certificate parses and that the key is its key (other blocks in either file,
    /// such as `EC PARAMETERS`, are skipped: a file holding both may be given twice).
    public init(certificatePEM: String, keyPEM: String) throws(ClientCertificateError) {
        let documents = (try? PEMDocument.parseMultiple(pemString: certificatePEM)) ?? []
        guard let first = documents.first(where: { $0.discriminator == "CERTIFICATE" }),
              let certificate = try? Certificate(derEncoded: first.derBytes) else {
            throw .certificate("holds no PEM certificate that can be read")
        }
        guard let block = ClientAssertionKey.privateKeyBlock(in: keyPEM), let key = try? Certificate.PrivateKey(pemEncoded: block) else {
            throw .key("holds no PEM private key that can be read (PKCS#8, SEC 1 or PKCS#1)")
        }
        guard key.publicKey == certificate.publicKey else {
            throw .key("is not the key of the certificate in client_certificate.certificate")
        }
        var jwk: [String: String]?
        if let ec = P256.Signing.PublicKey(certificate.publicKey) {
            jwk = JSONWebKey.ecParameters(curve: "P-256", point: ec.x963Representation)
        } else if let ec = P384.Signing.PublicKey(certificate.publicKey) {
            jwk = JSONWebKey.ecParameters(curve: "P-384", point: ec.x963Representation)
        } else if let rsa = _RSA.Signing.PublicKey(certificate.publicKey), let primitives = try? rsa.getKeyPrimitives() {
            jwk = JSONWebKey.rsaParameters(modulus: primitives.modulus, exponent: primitives.publicExponent)
        }
        if let members = jwk { jwk?["kid"] = JSONWebKey.thumbprint(of: members) }
        self.publicJWK = jwk
        self.certificateBase64 = Data(first.derBytes).base64EncodedString()
        self.certificatePEM = certificatePEM
        self.keyPEM = Secret(keyPEM)
        self.notValidBefore = certificate.notValidBefore
        self.notValidAfter = certificate.notValidAfter
    }
}

/// Whether Gatehouse pushes its authorization request to the upstream first (RFC 9126).
public enum PushedAuthorizationPolicy: String, Sendable, CaseIterable {
    /// When the upstream says it requires it (`require_pushed_authorization_requests` in its
    /// discovery document), or, for an upstream without discovery, when its PAR endpoint is configured.
    case auto
    /// Always: an upstream that offers no PAR endpoint cannot be signed in to.
    case always
    /// Never: the parameters go in the browser's URL.
    case never
}

/// A configuration problem with a client credential, as a sentence after its key's path.
public struct ClientCredentialError: Error, Sendable {
    public let message: String
    init(_ message: String) { self.message = message }
}

/// Which file of `client_certificate` is wrong, and why.
public enum ClientCertificateError: Error, Sendable {
    case certificate(String)
    case key(String)
}
