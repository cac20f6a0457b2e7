public import AsyncHTTPClient
public import Foundation
import GatehouseCore

/// Checks an identity token from Sign in with Apple (iOS's `identityToken`): RS256 with the key
/// its `kid` names in Apple's JWKS (cached; fetched again for an unknown `kid`, throttled),
/// `iss` `https://appleid.apple.com`, `aud` the app's bundle id, `exp` in the future, `sub` the
/// `user` the app sent, an `email`, and the nonce.
///
/// The nonce, as Apple documents it: the app puts SHA-256 of a random raw nonce, as lowercase hex,
/// in its `ASAuthorizationAppleIDRequest.nonce`, Apple copies that into the token's `nonce` claim,
/// and the app sends the RAW nonce here. The claim must equal SHA-256(raw nonce): sending the claim
/// itself (readable by anyone holding the token) proves nothing and is refused. With
/// `require_nonce` (the default) a request without a nonce is refused too.
public struct AppleIdentityVerifier: Sendable {
    /// Who Apple says signed in.
    public struct Identity: Sendable {
        public let subject: String
        public let email: String
        /// The token's `exp`: until then it must not be taken twice.
        public let expiresAt: Date
    }

    let settings: CentralSettings.Apple
    let keys: JWKSCache
    /// Allowed clock difference for `exp`.
    static let leeway: TimeInterval = 30

    /// - Parameter telemetry: the central upstream's, which counts Apple's key set fetches as its `jwks` calls.
    public init(settings: CentralSettings.Apple, httpClient: HTTPClient, timeout: Duration, telemetry: UpstreamTelemetry) {
        self.settings = settings
        self.keys = JWKSCache(url: settings.jwksURL, fetch: JWKSCache.httpFetcher(client: httpClient, timeout: timeout, telemetry: telemetry))
    }

    init(settings: CentralSettings.Apple, keys: JWKSCache) {
        self.settings = settings
        self.keys = keys
    }

    /// Throws `JOSEError` naming the failed check (`unavailable` when Apple's key set cannot be fetched).
    public func verify(_ identityToken: String, user: String, nonce: String?, now: Date = Date()) async throws(JOSEError) -> Identity {
        let verified = try await JWSVerifier.verify(identityToken, algorithm: .rs256, keys: keys, hmacSecret: nil)
        let claims = verified.claims
        guard claims["iss"]?.stringValue == CentralSettings.Apple.issuer else {
            throw JOSEError(check: "iss", detail: "the token is not issued by \(CentralSettings.Apple.issuer)")
        }
        let audiences = claims["aud"]?.stringValue.map { [$0] } ?? claims["aud"]?.arrayValue?.compactMap(\.stringValue) ?? []
        guard audiences.contains(settings.bundleID) else {
            throw JOSEError(check: "aud", detail: "the token is not for this app's bundle id")
        }
        guard let exp = claims["exp"]?.numberValue else { throw JOSEError(check: "exp", detail: "the token has no exp") }
        guard Date(timeIntervalSince1970: exp).addingTimeInterval(Self.leeway) > now else {
            throw JOSEError(check: "exp", detail: "the token has expired")
        }
        guard let subject = claims["sub"]?.stringValue, !subject.isEmpty else { throw JOSEError(check: "sub", detail: "the token has no sub") }
        guard subject == user else { throw JOSEError(check: "sub", detail: "the token's sub is not the user the app sent") }
        if let nonce {
            guard let tokenNonce = claims["nonce"]?.stringValue else {
                throw JOSEError(check: "nonce", detail: "the app sent a nonce and the token carries none")
            }
            guard SecureToken.constantTimeEquals(tokenNonce, Self.nonceClaim(forRawNonce: nonce)) else {
                throw JOSEError(check: "nonce", detail: "the token's nonce is not the SHA-256 of the raw nonce the app sent")
            }
        } else if settings.requireNonce {
            throw JOSEError(check: "nonce", detail: "the app sent no nonce; this app requires the raw nonce of its sign-in request")
        }
        guard let email = claims["email"]?.stringValue, !email.isEmpty else {
            throw JOSEError(check: "email", detail: "the token carries no email")
        }
        return Identity(subject: subject, email: email, expiresAt: Date(timeIntervalSince1970: exp).addingTimeInterval(Self.leeway))
    }

    /// The `nonce` claim Apple writes for a raw nonce: its SHA-256 as lowercase hex.
    public static func nonceClaim(forRawNonce raw: String) -> String {
        CentralRequestSigner.hexSHA256(Data(raw.utf8))
    }
}
