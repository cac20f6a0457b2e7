import Crypto
public import Foundation
public import GatehouseCore

/// The JWS algorithms Gatehouse verifies with. One is pinned per upstream: a JWS whose header names
/// any other (`none`, `HS256` where `RS256` is pinned, …) is refused before any key is looked at.
public enum JWSAlgorithm: String, Sendable, CaseIterable {
    case rs256 = "RS256"
    case es256 = "ES256"
    /// HMAC-SHA256 keyed with the client secret, and with nothing else (OIDC Core §10.1).
    case hs256 = "HS256"
}

/// A JSON value, as read from a JOSE header or claims set.
public enum JSONValue: Sendable, Equatable, Decodable {
    case null
    case bool(Bool)
    case number(Double)
    case string(String)
    case array([JSONValue])
    case object([String: JSONValue])

    public init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        if container.decodeNil() {
            self = .null
        } else if let value = try? container.decode(Bool.self) {
            self = .bool(value)
        } else if let value = try? container.decode(Double.self) {
            self = .number(value)
        } else if let value = try? container.decode(String.self) {
            self = .string(value)
        } else if let value = try? container.decode([JSONValue].self) {
            self = .array(value)
        } else {
            self = .object(try container.decode([String: JSONValue].self))
        }
    }

    public var stringValue: String? {
        switch self {
        case .string(let value): value
        default: nil
        }
    }

    public var numberValue: Double? {
        switch self {
        case .number(let value): value
        default: nil
        }
    }

    public var arrayValue: [JSONValue]? {
        switch self {
        case .array(let value): value
        default: nil
        }
    }

    /// A JSON object's members; `nil` for any other value.
    public static func parseObject(_ bytes: Data) -> [String: JSONValue]? {
        try? JSONDecoder().decode([String: JSONValue].self, from: bytes)
    }
}

/// The protected header fields Gatehouse reads.
public struct JWSHeader: Sendable, Equatable {
    /// `alg`, exactly as written.
    public let algorithm: String
    /// `kid`, when present.
    public let keyID: String?
    /// `typ`, when present.
    public let type: String?
}

/// A JWS in compact serialization (RFC 7515 §7.1), split and decoded but not verified.
public struct CompactJWS: Sendable {
    public let header: JWSHeader
    /// The payload bytes, exactly as signed.
    public let payload: Data
    /// The payload's members (the payload must be a JSON object).
    public let claims: [String: JSONValue]
    let signingInput: Data
    let signature: Data

    public init(_ compact: String) throws(JOSEError) {
        let parts = compact.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3 else {
            throw JOSEError(check: "malformed", detail: "a compact JWS is three base64url parts separated by dots")
        }
        guard let headerBytes = Base64URL.decode(String(parts[0])),
              let payloadBytes = Base64URL.decode(String(parts[1])),
              let signatureBytes = Base64URL.decode(String(parts[2]))
        else { throw JOSEError(check: "malformed", detail: "a part of the JWS is not base64url") }
        guard let fields = JSONValue.parseObject(headerBytes) else {
            throw JOSEError(check: "malformed", detail: "the JWS header is not a JSON object")
        }
        guard let algorithm = fields["alg"]?.stringValue else {
            throw JOSEError(check: "malformed", detail: "the JWS header has no alg")
        }
        if let kid = fields["kid"], kid.stringValue == nil {
            throw JOSEError(check: "malformed", detail: "the JWS header's kid is not a string")
        }
        // RFC 7515 §4.1.11: extensions a recipient does not understand make the JWS invalid.
        if fields["crit"] != nil {
            throw JOSEError(check: "malformed", detail: "the JWS header names critical extensions Gatehouse does not understand")
        }
        guard let claims = JSONValue.parseObject(payloadBytes) else {
            throw JOSEError(check: "malformed", detail: "the JWS payload is not a JSON object")
        }
        self.header = JWSHeader(algorithm: algorithm, keyID: fields["kid"]?.stringValue, type: fields["typ"]?.stringValue)
        self.payload = payloadBytes
        self.claims = claims
        self.signingInput = Data((String(parts[0]) + "." + String(parts[1])).utf8)
        self.signature = signatureBytes
    }
}

/// A JWS whose signature was checked with the pinned algorithm.
public struct VerifiedJWS: Sendable {
    public let header: JWSHeader
    /// The payload bytes, exactly as signed.
    public let payload: Data
    public let claims: [String: JSONValue]
}

/// Signature check of a compact JWS with a pinned algorithm.
///
/// The header's `alg` must be the pinned one, exactly. `HS256` verifies only with the client secret
/// (never with a key of the JWKS: an RSA or EC public key is never an HMAC secret); `RS256` and
/// `ES256` only with keys of the JWKS of the matching type, the one the header's `kid` names (a JWS
/// without `kid` only when the set holds exactly one key of that type).
public enum JWSVerifier {
    public static func verify(_ compact: String, algorithm: JWSAlgorithm, keys: JWKSCache?, hmacSecret: Secret?)
        async throws(JOSEError) -> VerifiedJWS
    {
        let jws = try CompactJWS(compact)
        try checkAlgorithm(jws, algorithm)
        switch algorithm {
        case .hs256:
            guard let hmacSecret else {
                throw JOSEError(check: "alg", detail: "HS256 is verified with the client secret, and there is none")
            }
            return try verify(jws, hmacSecret: hmacSecret)
        case .rs256, .es256:
            guard let keys else {
                throw JOSEError(check: "alg", detail: "\(algorithm.rawValue) needs a key set, and the upstream has none")
            }
            switch try await keys.lookup(keyID: jws.header.keyID, algorithm: algorithm) {
            case .found(let candidates):
                return try verify(jws, algorithm: algorithm, candidates: candidates)
            case .unknown(let refetched):
                throw JOSEError(check: "kid", detail: refetched
                    ? "the JWS names a key the upstream's key set does not hold, even freshly fetched"
                    : "the JWS names a key the upstream's key set did not hold at its last fetch (refetch throttled)")
            case .unusable(let detail):
                throw JOSEError(check: "kid", detail: detail)
            }
        }
    }

    /// Checks `jws` with keys already looked up (`JWKSCache.lookup`), for RS256 or ES256.
    public static func verify(_ jws: CompactJWS, algorithm: JWSAlgorithm, candidates: [JWKSCache.Key]) throws(JOSEError) -> VerifiedJWS {
        try checkAlgorithm(jws, algorithm)
        guard algorithm != .hs256 else {
            throw JOSEError(check: "alg", detail: "HS256 is never verified with a key of the key set")
        }
        for key in candidates where key.algorithm == algorithm {
            if key.verifies(jws.signature, of: jws.signingInput) {
                return VerifiedJWS(header: jws.header, payload: jws.payload, claims: jws.claims)
            }
        }
        throw JOSEError(check: "signature", detail: "the \(algorithm.rawValue) signature does not verify")
    }

    /// Checks an HS256 `jws` with the client secret, the only key of the collection.
    public static func verify(_ jws: CompactJWS, hmacSecret: Secret) throws(JOSEError) -> VerifiedJWS {
        try checkAlgorithm(jws, .hs256)
        let key = SymmetricKey(data: Data(hmacSecret.reveal().utf8))
        guard jws.signature.count == SHA256.byteCount,
              HMAC<SHA256>.isValidAuthenticationCode(jws.signature, authenticating: jws.signingInput, using: key)
        else { throw JOSEError(check: "signature", detail: "the HS256 signature does not verify with the client secret") }
        return VerifiedJWS(header: jws.header, payload: jws.payload, claims: jws.claims)
    }

    static func checkAlgorithm(_ jws: CompactJWS, _ algorithm: JWSAlgorithm) throws(JOSEError) {
        guard jws.header.algorithm == algorithm.rawValue else {
            throw JOSEError(check: "alg", detail: "the JWS header's alg is not the pinned \(algorithm.rawValue)")
        }
    }
}
