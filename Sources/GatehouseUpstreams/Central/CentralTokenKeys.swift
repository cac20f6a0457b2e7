import _CryptoExtras
import Crypto
public import Foundation
import GatehouseCore

/// Gatehouse's RS256 keys for the access tokens it mints for a `central` upstream (seed 002 §4):
/// the first key signs; every key is published in `/.well-known/jwks.json` and accepted, so a key
/// rotated in (listed second, then first) never cuts off tokens signed by the one before it.
public struct CentralTokenKeys: Sendable {
    struct SigningKey: Sendable {
        let id: String
        let privateKey: _RSA.Signing.PrivateKey
        let jwk: [String: String]
    }

    private let keys: [SigningKey]
    /// `iss` of every token (the seed's is the app id).
    public let issuer: String
    /// `aud` of every token: the app id, so a token of one central app is refused by another's
    /// routes even when both share keys and issuer (the seed's apps ignore the extra claim).
    public let audience: String

    /// `privateKeyPEMs`: RSA private keys of at least 2048 bits, the signing one first. Secret.
    public init(privateKeyPEMs: [String], issuer: String, audience: String = "") throws {
        guard !privateKeyPEMs.isEmpty else { throw CentralSigningError() }
        self.issuer = issuer
        self.audience = audience.isEmpty ? issuer : audience
        self.keys = try privateKeyPEMs.map { pem in
            let key = try _RSA.Signing.PrivateKey(pemRepresentation: pem)
            guard key.keySizeInBits >= 2048 else { throw CentralSigningError() }
            let primitives = try key.publicKey.getKeyPrimitives()
            var jwk = JSONWebKey.rsaParameters(modulus: primitives.modulus, exponent: primitives.publicExponent)
            guard let kid = JSONWebKey.thumbprint(of: jwk) else { throw CentralSigningError() }
            jwk.merge(["kid": kid, "alg": "RS256", "use": "sig"]) { $1 }
            return SigningKey(id: kid, privateKey: key, jwk: jwk)
        }
    }

    /// The public keys, signing key first (RFC 7517 JWKs).
    public var jwks: [[String: String]] { keys.map(\.jwk) }

    /// The `kid` new tokens carry.
    public var signingKeyID: String { keys[0].id }

    /// The JWK Set as bytes, for an in-process `JWKSCache`.
    public var jwksDocument: Data {
        (try? JSONSerialization.data(withJSONObject: ["keys": jwks], options: [.sortedKeys])) ?? Data()
    }

    /// An access token: `{"data":{userId,email,name,provider},"sub","iss","aud","iat","exp"}`, RS256, `kid` in the header.
    public func accessToken(for user: CentralUser, issuedAt: Date, expiresAt: Date) throws -> String {
        let header = #"{"alg":"RS256","kid":"\#(keys[0].id)","typ":"JWT"}"#
        let claims = AccessClaims(data: user, sub: user.userId, iss: issuer, aud: audience,
                                  iat: Int(issuedAt.timeIntervalSince1970.rounded(.down)),
                                  exp: Int(expiresAt.timeIntervalSince1970.rounded(.down)))
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        let signingInput = Base64URL.encode(Data(header.utf8)) + "." + Base64URL.encode(try encoder.encode(claims))
        let signature = try keys[0].privateKey.signature(for: Data(signingInput.utf8), padding: .insecurePKCS1v1_5)
        return signingInput + "." + Base64URL.encode(signature.rawRepresentation)
    }

    private struct AccessClaims: Encodable {
        let data: CentralUser
        let sub: String
        let iss: String
        let aud: String
        let iat: Int
        let exp: Int
    }
}

/// Who signed in, as the central provider's verify answers it: `{userId, email, name, provider}`.
public struct CentralUser: Sendable, Codable, Equatable {
    public var userId: String
    public var email: String
    public var name: String
    public var provider: String

    public init(userId: String, email: String, name: String, provider: String) {
        self.userId = userId
        self.email = email
        self.name = name
        self.provider = provider
    }
}
