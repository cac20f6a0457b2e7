// @preconcurrency: swift-crypto 3 does not declare its keys Sendable (4 does, for the same
// immutable key), and the client takes either (docs/client-package.md).
@preconcurrency public import Crypto
public import Foundation

/// A DPoP key (RFC 9449) on P-256: proves possession in a `DPoP` header on every request of the
/// dialogue and on the token request, and the tokens are then bound to it (`token_type` DPoP).
/// Keep it (in the Keychain or Secure Enclave's wrapped form) as long as the tokens.
public struct DPoPKey: Sendable {
    public let privateKey: P256.Signing.PrivateKey

    public init(privateKey: P256.Signing.PrivateKey) {
        self.privateKey = privateKey
    }

    /// A new random key.
    public init() {
        self.privateKey = P256.Signing.PrivateKey()
    }

    /// The public key as a JWK (RFC 7518 §6.2.1): `kty`, `crv`, `x`, `y`.
    public var publicJWK: [String: String] {
        let raw = privateKey.publicKey.rawRepresentation
        return ["kty": "EC", "crv": "P-256",
                "x": Base64URL.encode(raw.prefix(32)), "y": Base64URL.encode(raw.suffix(32))]
    }

    /// The JWK SHA-256 thumbprint (RFC 7638): the `jkt` the server binds the dialogue and the tokens to.
    public var thumbprint: String {
        let jwk = publicJWK
        let canonical = #"{"crv":"P-256","kty":"EC","x":"\#(jwk["x"]!)","y":"\#(jwk["y"]!)"}"#
        return Base64URL.encode(SHA256.hash(data: Data(canonical.utf8)))
    }

    /// A proof JWT (RFC 9449 §4.2) for one request: header `typ` dpop+jwt, `alg` ES256, `jwk`;
    /// claims `jti` (random), `htm`, `htu` (`url` without query and fragment), `iat`, and `nonce`
    /// when the server asked for one, `ath` when the request presents an access token.
    public func proof(method: String, url: URL, nonce: String? = nil, accessToken: String? = nil,
                      issuedAt: Date = Date()) throws -> String {
        let header: [String: Any] = ["typ": "dpop+jwt", "alg": "ES256", "jwk": publicJWK]
        var claims: [String: Any] = [
            "jti": Base64URL.encode(randomBytes(16)),
            "htm": method.uppercased(),
            "htu": Self.htu(url),
            "iat": Int(issuedAt.timeIntervalSince1970),
        ]
        if let nonce { claims["nonce"] = nonce }
        if let accessToken { claims["ath"] = Base64URL.encode(SHA256.hash(data: Data(accessToken.utf8))) }
        let options: JSONSerialization.WritingOptions = [.sortedKeys, .withoutEscapingSlashes]
        let signingInput = Base64URL.encode(try JSONSerialization.data(withJSONObject: header, options: options)) + "."
            + Base64URL.encode(try JSONSerialization.data(withJSONObject: claims, options: options))
        let signature = try privateKey.signature(for: Data(signingInput.utf8))
        return signingInput + "." + Base64URL.encode(signature.rawRepresentation)
    }

    /// The `htu` of a request to `url`: its URI without query and fragment (RFC 9449 §4.2).
    public static func htu(_ url: URL) -> String {
        guard var components = URLComponents(url: url, resolvingAgainstBaseURL: false) else { return url.absoluteString }
        components.query = nil
        components.fragment = nil
        return components.url?.absoluteString ?? url.absoluteString
    }
}

extension DPoPKey: CustomStringConvertible, CustomDebugStringConvertible {
    /// The thumbprint only, never the private key.
    public var description: String { "DPoPKey(jkt: \(thumbprint))" }
    public var debugDescription: String { description }
}
