import Crypto
public import Foundation
public import GatehouseCore

/// What an ID token must say for one sign-in (OpenID Connect Core §3.1.3.7).
public struct IDTokenExpectations: Sendable {
    /// The upstream's issuer, compared exactly with `iss`.
    public var issuer: String
    /// Gatehouse's client_id at the upstream: in `aud`, and `azp` when present.
    public var clientID: String
    /// The nonce sent in the authorization request (bound to the transaction), if any.
    public var nonce: String?
    /// The `acr_values` requested, if any (space-separated): `acr` must be one of them.
    public var acr: String?
    /// The access token of the same token response, for `at_hash`.
    public var accessToken: String?
    public var algorithm: JWSAlgorithm
    /// Allowed clock difference for `exp` and `iat`.
    public var leeway: Duration
    public var now: Date

    public init(issuer: String, clientID: String, nonce: String? = nil, acr: String? = nil, accessToken: String? = nil,
                algorithm: JWSAlgorithm = .rs256, leeway: Duration = .seconds(30), now: Date = Date()) {
        self.issuer = issuer
        self.clientID = clientID
        self.nonce = nonce
        self.acr = acr
        self.accessToken = accessToken
        self.algorithm = algorithm
        self.leeway = leeway
        self.now = now
    }
}

/// A validated ID token's claims.
public struct IDTokenClaims: Sendable {
    public let subject: String
    /// The payload bytes, exactly as signed.
    public let payload: Data
    public let claims: [String: JSONValue]
    public let expiresAt: Date
    public let issuedAt: Date
    public let acr: String?
    /// `sid` (OIDC Front/Back-Channel Logout), when present.
    public let sessionID: String?
    public let authTime: Date?
    public let nonce: String?
}

/// ID-token validation (OpenID Connect Core §3.1.3.7): signature with the pinned algorithm, `iss`,
/// `aud` (and `azp`), `exp` and `iat` within the leeway, `nonce`, `acr`, `at_hash`, `sub`.
public enum IDTokenValidator {
    public static func validate(_ idToken: String, expecting expected: IDTokenExpectations, keys: JWKSCache?, hmacSecret: Secret?)
        async throws(JOSEError) -> IDTokenClaims
    {
        let verified = try await JWSVerifier.verify(idToken, algorithm: expected.algorithm, keys: keys, hmacSecret: hmacSecret)
        return try check(verified, expecting: expected)
    }

    /// `iss` is the upstream's issuer and `aud` (a string or an array of strings) names Gatehouse's
    /// client_id: what makes an ID token one the upstream issued to Gatehouse. Returns the audiences.
    public static func issuerAndAudiences(_ claims: [String: JSONValue], issuer: String, clientID: String) throws(JOSEError) -> [String] {
        guard let named = claims["iss"]?.stringValue, named == issuer else {
            throw JOSEError(check: "iss", detail: "the ID token's iss is not the upstream's issuer")
        }
        let audiences: [String]
        switch claims["aud"] {
        case .string(let audience)?:
            audiences = [audience]
        case .array(let values)?:
            audiences = values.compactMap(\.stringValue)
            guard audiences.count == values.count else {
                throw JOSEError(check: "aud", detail: "the ID token's aud holds a value that is not a string")
            }
        default:
            throw JOSEError(check: "aud", detail: "the ID token has no aud")
        }
        guard audiences.contains(clientID) else {
            throw JOSEError(check: "aud", detail: "the ID token's aud does not name Gatehouse's client_id")
        }
        return audiences
    }

    /// The claim checks, on a JWS whose signature was verified.
    public static func check(_ verified: VerifiedJWS, expecting expected: IDTokenExpectations) throws(JOSEError) -> IDTokenClaims {
        let claims = verified.claims

        let audiences = try issuerAndAudiences(claims, issuer: expected.issuer, clientID: expected.clientID)
        let azp = claims["azp"]
        if let azp, azp.stringValue != expected.clientID {
            throw JOSEError(check: "azp", detail: "the ID token's azp is not Gatehouse's client_id")
        }
        if audiences.count > 1, azp == nil {
            throw JOSEError(check: "azp", detail: "the ID token names several audiences and no azp")
        }

        let leeway = expected.leeway.inSeconds
        guard let exp = claims["exp"]?.numberValue else {
            throw JOSEError(check: "exp", detail: "the ID token has no exp")
        }
        let expiresAt = Date(timeIntervalSince1970: exp)
        guard expiresAt > expected.now.addingTimeInterval(-leeway) else {
            throw JOSEError(check: "exp", detail: "the ID token has expired")
        }
        guard let iat = claims["iat"]?.numberValue else {
            throw JOSEError(check: "iat", detail: "the ID token has no iat")
        }
        let issuedAt = Date(timeIntervalSince1970: iat)
        guard issuedAt <= expected.now.addingTimeInterval(leeway) else {
            throw JOSEError(check: "iat", detail: "the ID token was issued in the future")
        }

        let nonce = claims["nonce"]?.stringValue
        if let expectedNonce = expected.nonce {
            guard let nonce else { throw JOSEError(check: "nonce", detail: "the ID token has no nonce, and one was sent") }
            guard constantTimeEqual(nonce, expectedNonce) else {
                throw JOSEError(check: "nonce", detail: "the ID token's nonce is not the one sent for this sign-in")
            }
        }

        let acr = claims["acr"]?.stringValue
        if let requested = expected.acr {
            let accepted = requested.split(separator: " ").map(String.init)
            guard let acr, accepted.contains(acr) else {
                throw JOSEError(check: "acr", detail: "the ID token's acr is not the one requested")
            }
        }

        if let atHashClaim = claims["at_hash"], let accessToken = expected.accessToken {
            guard let atHash = atHashClaim.stringValue, constantTimeEqual(atHash, accessTokenHash(accessToken)) else {
                throw JOSEError(check: "at_hash", detail: "the ID token's at_hash does not match the access token")
            }
        }

        guard let subject = claims["sub"]?.stringValue, !subject.isEmpty else {
            throw JOSEError(check: "sub", detail: "the ID token has no sub")
        }

        return IDTokenClaims(subject: subject, payload: verified.payload, claims: claims, expiresAt: expiresAt, issuedAt: issuedAt,
                             acr: acr, sessionID: claims["sid"]?.stringValue,
                             authTime: (claims["auth_time"]?.numberValue).map { Date(timeIntervalSince1970: $0) }, nonce: nonce)
    }

    /// `at_hash` for RS256, ES256 and HS256: the left half of the SHA-256 of the token's ASCII
    /// bytes, base64url (OIDC Core §3.1.3.6).
    public static func accessTokenHash(_ accessToken: String) -> String {
        Base64URL.encode(SHA256.hash(data: Data(accessToken.utf8)).prefix(16))
    }

    static func constantTimeEqual(_ a: String, _ b: String) -> Bool {
        let (x, y) = (Array(a.utf8), Array(b.utf8))
        guard x.count == y.count else { return false }
        var difference: UInt8 = 0
        for (p, q) in zip(x, y) { difference |= p ^ q }
        return difference == 0
    }
}
