import Foundation
public import GatehouseCore
import JWTKit

/// Signs the short-lived assertions that replace the app's token toward backends whose
/// route says `authorization: assertion`, and publishes the public key as a JWKS.
///
/// The key is ES256: loaded from `server.signing_key_file` (PEM), or generated at start
/// when none is configured (fine for one instance; several instances must share a file).
public struct AssertionSigner: Sendable {
    private let keys: JWTKeyCollection
    public let keyID: String
    private let publicJWK: [String: String]
    private let issuer: String
    public let lifetime: Duration

    public init(privateKeyPEM: Secret?, issuer: String, lifetime: Duration = .seconds(60)) async throws {
        let key = try privateKeyPEM.map { try ES256PrivateKey(pem: $0.reveal()) } ?? ES256PrivateKey()
        guard let parameters = key.publicKey.parameters else { throw AssertionSignerError() }
        // RFC 7638 thumbprint of the public key as its kid, so every instance sharing the key agrees.
        let canonical = #"{"crv":"P-256","kty":"EC","x":"\#(parameters.x)","y":"\#(parameters.y)"}"#
        self.keyID = SecureToken.hash(canonical)
        self.keys = JWTKeyCollection()
        await keys.add(ecdsa: key, kid: JWKIdentifier(string: keyID))
        self.publicJWK = ["kty": "EC", "crv": "P-256", "x": parameters.x, "y": parameters.y, "kid": keyID, "alg": "ES256", "use": "sig"]
        self.issuer = issuer
        self.lifetime = lifetime
    }

    /// The JWKS document (RFC 7517) backends verify assertions with.
    public var jwks: [String: [[String: String]]] { ["keys": [publicJWK]] }

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
