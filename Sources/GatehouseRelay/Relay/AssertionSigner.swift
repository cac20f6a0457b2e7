import Crypto
public import Foundation
public import GatehouseCore
import JWTKit

/// Signs the short-lived assertions that replace the app's token toward backends whose
/// route says `authorization: assertion`, and publishes the public key as a JWKS.
///
/// The key is ES256: loaded from `server.signing_key_file` (PEM); else derived from the session
/// key ring (`init(derivingFrom:)`: the same on every instance and after a restart, and rotated
/// with the ring); else generated at start (one instance, no sealed sessions).
public struct AssertionSigner: Sendable {
    private let keys: JWTKeyCollection
    /// The key that signs; the others (older ring keys) still verify and are still published.
    public let keyID: String
    private let publicJWKs: [[String: String]]
    private let issuer: String
    public let lifetime: Duration

    public init(privateKeyPEM: Secret?, issuer: String, lifetime: Duration = .seconds(60)) async throws {
        let key = try privateKeyPEM.map { try ES256PrivateKey(pem: $0.reveal()) } ?? ES256PrivateKey()
        try await self.init(keys: [key], issuer: issuer, lifetime: lifetime)
    }

    /// Keys derived (HKDF-SHA256, a purpose of their own) from each key of the session key ring:
    /// the first signs, all verify.
    public init(derivingFrom ring: KeyRing, issuer: String, lifetime: Duration = .seconds(60)) async throws {
        let keys = try ring.derivedSecrets(purpose: "gatehouse es256 signing key v1").map { seed in
            try ES256PrivateKey(pem: P256.Signing.PrivateKey(rawRepresentation: seed).pemRepresentation)
        }
        try await self.init(keys: keys, issuer: issuer, lifetime: lifetime)
    }

    private init(keys signingKeys: [ES256PrivateKey], issuer: String, lifetime: Duration) async throws {
        self.keys = JWTKeyCollection()
        var jwks: [[String: String]] = []
        for key in signingKeys {
            guard let parameters = key.publicKey.parameters else { throw AssertionSignerError() }
            var jwk = ["kty": "EC", "crv": "P-256", "x": parameters.x, "y": parameters.y]
            // RFC 7638 thumbprint of the public key as its kid, so every instance sharing the key agrees.
            guard let kid = JSONWebKey.thumbprint(of: jwk) else { throw AssertionSignerError() }
            await keys.add(ecdsa: key, kid: JWKIdentifier(string: kid))
            jwk.merge(["kid": kid, "alg": "ES256", "use": "sig"]) { $1 }
            jwks.append(jwk)
        }
        guard let first = jwks.first?["kid"] else { throw AssertionSignerError() }
        self.keyID = first
        self.publicJWKs = jwks
        self.issuer = issuer
        self.lifetime = lifetime
    }

    /// The JWKS document (RFC 7517) backends verify assertions with.
    public var jwks: [String: [[String: String]]] { ["keys": publicJWKs] }

    /// A JWT saying who the caller is, for one backend (`aud`), valid for `lifetime`.
    public func assertion(for identity: CallerIdentity, audience: String) async throws -> String {
        let now = Date()
        let claims = AssertionClaims(
            iss: IssuerClaim(value: issuer), sub: SubjectClaim(value: identity.subject ?? ""),
            aud: AudienceClaim(value: audience), iat: IssuedAtClaim(value: now),
            exp: ExpirationClaim(value: now.addingTimeInterval(Double(lifetime.components.seconds))),
            jti: IDClaim(value: SecureToken.generate()), bpid: identity.bpid, scope: identity.value(of: "scopes"))
        var header = JWTHeader()
        header.typ = "JWT"
        return try await keys.sign(claims, kid: JWKIdentifier(string: keyID), header: header)
    }
}

extension AssertionSigner {
    /// The ID token Gatehouse gives a sealed app of an OpenID Connect upstream (OpenID Connect
    /// Core §2): who signed in (`sub`), for which app (`aud`), in which session (`sid`), with the
    /// app's `nonce`. The app presents it back as `id_token_hint` to log out.
    public func idToken(subject: String, audience: String, sessionHandle: String, nonce: String?, lifetime: Duration) async throws -> String {
        // Whole seconds, as every OpenID Provider sends them: typed decoders in apps expect integers.
        let now = Date(timeIntervalSince1970: Date().timeIntervalSince1970.rounded(.down))
        let claims = GatehouseIDTokenClaims(
            iss: IssuerClaim(value: issuer), sub: SubjectClaim(value: subject), aud: AudienceClaim(value: audience),
            iat: IssuedAtClaim(value: now), exp: ExpirationClaim(value: now.addingTimeInterval(Double(lifetime.components.seconds))),
            sid: sessionHandle, nonce: nonce)
        var header = JWTHeader()
        header.typ = "JWT"
        return try await keys.sign(claims, kid: JWKIdentifier(string: keyID), header: header)
    }

    /// The session handle and audience of an ID token Gatehouse signed, whatever its expiry
    /// (an expired ID token still names the session to end, OpenID Connect RP-Initiated Logout §2);
    /// `nil` when it is not one of Gatehouse's.
    public func verifiedIDTokenHint(_ token: String) async -> (sessionHandle: String, audience: [String])? {
        guard let claims = try? await keys.verify(token, as: GatehouseIDTokenClaims.self), claims.iss.value == issuer else { return nil }
        return (claims.sid, claims.aud.value)
    }
}

struct GatehouseIDTokenClaims: JWTPayload {
    let iss: IssuerClaim
    let sub: SubjectClaim
    let aud: AudienceClaim
    let iat: IssuedAtClaim
    let exp: ExpirationClaim
    let sid: String
    let nonce: String?

    /// Signature only: the caller decides what the expiry means.
    func verify(using algorithm: some JWTAlgorithm) async throws {}
}

struct AssertionSignerError: Error, CustomStringConvertible {
    var description: String { "the signing key has no public parameters" }
}

struct AssertionClaims: JWTPayload {
    let iss: IssuerClaim
    let sub: SubjectClaim
    let aud: AudienceClaim
    let iat: IssuedAtClaim
    let exp: ExpirationClaim
    let jti: IDClaim
    let bpid: String?
    let scope: String?

    func verify(using algorithm: some JWTAlgorithm) async throws {
        try exp.verifyNotExpired()
    }
}
