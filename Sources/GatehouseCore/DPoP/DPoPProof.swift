import Crypto
import _CryptoExtras
public import Foundation
import Synchronization

/// Why a DPoP proof was refused, in words safe to show the app. `useNonce`: the proof lacks the
/// server's current nonce (RFC 9449 §8: answer `use_dpop_nonce` with a fresh one).
public struct DPoPProofError: Error, Sendable, CustomStringConvertible {
    public let description: String
    public let useNonce: Bool

    init(_ description: String, useNonce: Bool = false) {
        self.description = description
        self.useNonce = useNonce
    }
}

/// A proof that passed every check but the `jti` replay check (the caller's: it needs a cache).
public struct VerifiedDPoPProof: Sendable, Equatable {
    /// The RFC 7638 thumbprint of the proof's key (base64url SHA-256): what tokens are bound to.
    public let thumbprint: String
    public let jti: String
    public let issuedAt: Date
    /// The epoch of the server nonce the proof carries, when nonces are required (`DPoPNonces`).
    public let nonceEpoch: Int64?

    public init(thumbprint: String, jti: String, issuedAt: Date, nonceEpoch: Int64? = nil) {
        self.thumbprint = thumbprint
        self.jti = jti
        self.issuedAt = issuedAt
        self.nonceEpoch = nonceEpoch
    }
}

/// DPoP proofs (RFC 9449 §4): a JWT signed by the app's key, naming the request it goes with.
public enum DPoPProof {
    /// The algorithms Gatehouse verifies (never `none`, never a MAC).
    public static let algorithms = ["ES256", "RS256", "PS256", "EdDSA"]
    static let maximumLength = 8 * 1024

    /// The checks of RFC 9449 §4.3, but the `jti` replay check: one well-formed JWT of type
    /// `dpop+jwt`, an asymmetric `alg`, a public `jwk` that verifies the signature, `htm` =
    /// `method`, `htu` = `url` (scheme and host case-insensitive, default port dropped, no query
    /// or fragment), `iat` within `lifetime` of `now` either way, `ath` = the hash of
    /// `accessToken` when one is presented, and a valid server nonce when `nonces` requires one.
    public static func verify(_ proof: String, method: String, url: String, accessToken: String?, now: Date, lifetime: TimeInterval,
                              nonces: DPoPNonces?) throws(DPoPProofError) -> VerifiedDPoPProof {
        guard proof.utf8.count <= maximumLength else { throw DPoPProofError("the DPoP proof is too long") }
        // Split on the bytes: `String.split` would walk the proof by grapheme clusters.
        let utf8 = proof.utf8, dot = UInt8(ascii: ".")
        guard let first = utf8.firstIndex(of: dot), let second = utf8[utf8.index(after: first)...].firstIndex(of: dot),
              !utf8[utf8.index(after: second)...].contains(dot),
              let payloadBytes = Base64URL.decode(Substring(utf8[utf8.index(after: first)..<second])),
              let signature = Base64URL.decode(Substring(utf8[utf8.index(after: second)...])),
              let claims = (try? JSONSerialization.jsonObject(with: payloadBytes)) as? [String: Any]
        else { throw DPoPProofError("the DPoP proof is not a JWT") }
        // An app signs every proof with one key under the same header: its checks and the parsed
        // key are kept (`ProofHeaders`), once a signature by it has been verified.
        let headerSegment = Substring(utf8[..<first])
        let cached = ProofHeaders.shared.header(headerSegment)
        let header: Header
        if let cached { header = cached } else { header = try checkedHeader(headerSegment) }
        guard header.key.isValidSignature(signature, for: Data(utf8[..<second]), alg: header.alg) else {
            throw DPoPProofError("the DPoP proof's signature is not valid")
        }
        if cached == nil { ProofHeaders.shared.remember(header, for: headerSegment) }

        guard let jti = claims["jti"] as? String, !jti.isEmpty, jti.utf8.count <= 256 else {
            throw DPoPProofError("the DPoP proof needs a jti of at most 256 characters")
        }
        guard claims["htm"] as? String == method else { throw DPoPProofError("the DPoP proof's htm is not this request's method") }
        // The same text needs no normalizing (the usual case: the app names the URL it calls).
        guard let htu = claims["htu"] as? String, htu.utf8.elementsEqual(url.utf8) || normalizedURI(htu).map({ $0 == normalizedURI(url) }) == true
        else {
            throw DPoPProofError("the DPoP proof's htu is not this request's URI")
        }
        guard let iat = (claims["iat"] as? NSNumber)?.doubleValue, iat.isFinite, abs(iat - now.timeIntervalSince1970) <= lifetime else {
            throw DPoPProofError("the DPoP proof's iat is missing, too old or in the future")
        }
        if let accessToken {
            let expected = Base64URL.encode(SHA256.hash(data: Data(accessToken.utf8)))
            guard let ath = claims["ath"] as? String, ath == expected else {
                throw DPoPProofError("the DPoP proof's ath is not the hash of the access token")
            }
        }
        var nonceEpoch: Int64?
        if let nonces {
            guard let nonce = claims["nonce"] as? String, let epoch = nonces.epoch(of: nonce, now: now) else {
                throw DPoPProofError("the DPoP proof must carry the server's current nonce", useNonce: true)
            }
            nonceEpoch = epoch
        }
        return VerifiedDPoPProof(thumbprint: header.thumbprint, jti: jti, issuedAt: Date(timeIntervalSince1970: iat), nonceEpoch: nonceEpoch)
    }

    /// A proof's header, checked: one of `algorithms`, a public `jwk` of the right kind, parsed.
    struct Header: Sendable {
        let alg: String
        let key: PublicKey
        /// RFC 7638, of the `jwk`.
        let thumbprint: String
    }

    private static func checkedHeader(_ segment: Substring) throws(DPoPProofError) -> Header {
        guard let headerBytes = Base64URL.decode(segment),
              let header = (try? JSONSerialization.jsonObject(with: headerBytes)) as? [String: Any]
        else { throw DPoPProofError("the DPoP proof is not a JWT") }
        guard header["typ"] as? String == "dpop+jwt" else { throw DPoPProofError("the DPoP proof's typ must be dpop+jwt") }
        guard let alg = header["alg"] as? String, algorithms.contains(alg) else {
            throw DPoPProofError("the DPoP proof's alg must be one of " + algorithms.joined(separator: ", "))
        }
        guard let jwk = header["jwk"] as? [String: Any] else { throw DPoPProofError("the DPoP proof carries no jwk") }
        let privateMembers = ["d", "p", "q", "dp", "dq", "qi", "k", "oth"]
        guard !jwk.keys.contains(where: privateMembers.contains) else { throw DPoPProofError("the DPoP proof's jwk holds a private key") }
        let key = try PublicKey(alg: alg, jwk: jwk)
        guard let thumbprint = JSONWebKey.thumbprint(of: jwk) else { throw DPoPProofError("the DPoP proof's jwk is not a usable public key") }
        return Header(alg: alg, key: key, thumbprint: thumbprint)
    }

    /// A proof's public key, of one of `algorithms`.
    enum PublicKey: Sendable {
        case p256(P256.Signing.PublicKey)
        case rsa(_RSA.Signing.PublicKey)
        case ed25519(Curve25519.Signing.PublicKey)

        init(alg: String, jwk: [String: Any]) throws(DPoPProofError) {
            switch alg {
            case "ES256":
                guard jwk["kty"] as? String == "EC", jwk["crv"] as? String == "P-256",
                      let x = (jwk["x"] as? String).flatMap(Base64URL.decode), let y = (jwk["y"] as? String).flatMap(Base64URL.decode),
                      x.count == 32, y.count == 32, let key = try? P256.Signing.PublicKey(rawRepresentation: x + y)
                else { throw DPoPProofError("ES256 needs an EC P-256 jwk") }
                self = .p256(key)
            case "RS256", "PS256":
                guard jwk["kty"] as? String == "RSA", let n = (jwk["n"] as? String).flatMap(Base64URL.decode),
                      let e = (jwk["e"] as? String).flatMap(Base64URL.decode),
                      let key = try? _RSA.Signing.PublicKey(n: n, e: e), key.keySizeInBits >= 2048
                else { throw DPoPProofError("\(alg) needs an RSA jwk of at least 2048 bits") }
                self = .rsa(key)
            default:
                guard jwk["kty"] as? String == "OKP", jwk["crv"] as? String == "Ed25519",
                      let x = (jwk["x"] as? String).flatMap(Base64URL.decode), let key = try? Curve25519.Signing.PublicKey(rawRepresentation: x)
                else { throw DPoPProofError("EdDSA needs an OKP Ed25519 jwk") }
                self = .ed25519(key)
            }
        }

        func isValidSignature(_ signature: Data, for input: Data, alg: String) -> Bool {
            switch self {
            case .p256(let key):
                guard let ecdsa = try? P256.Signing.ECDSASignature(rawRepresentation: signature) else { return false }
                return key.isValidSignature(ecdsa, for: input)
            case .rsa(let key):
                return key.isValidSignature(_RSA.Signing.RSASignature(rawRepresentation: signature), for: SHA256.hash(data: input),
                                            padding: alg == "RS256" ? .insecurePKCS1v1_5 : .PSS)
            case .ed25519(let key):
                return key.isValidSignature(signature, for: input)
            }
        }
    }

    /// `scheme://host[:port]/path` with scheme and host in lower case, the default port dropped,
    /// an empty path as `/`, no query or fragment (RFC 9449 §4.3 point 9, RFC 3986 §6.2.2–6.2.3).
    static func normalizedURI(_ text: String) -> String? {
        guard let components = URLComponents(string: text), let scheme = components.scheme?.lowercased(),
              let host = components.host?.lowercased(), !host.isEmpty, components.user == nil else { return nil }
        let defaultPort = scheme == "https" ? 443 : scheme == "http" ? 80 : nil
        let port = components.port.flatMap { $0 == defaultPort ? nil : $0 }
        let path = components.percentEncodedPath.isEmpty ? "/" : components.percentEncodedPath
        return scheme + "://" + host + (port.map { ":\($0)" } ?? "") + path
    }
}

/// The checked headers of proofs whose signature verified (`DPoPProof.Header`), by their encoded
/// text: an app signs every proof with the same key and header, so its header is decoded, its
/// key parsed and its thumbprint computed once. Only a header whose key verified a signature is
/// kept (nothing an unsigned request sends takes room); when full, it starts again empty.
final class ProofHeaders: Sendable {
    static let shared = ProofHeaders(maximumEntries: 10_000)

    /// A header longer than this is checked every time, never kept.
    static let maximumSegment = 2048

    private let maximumEntries: Int
    /// By the segment's text. A lookup also compares the bytes of the key it found, since
    /// `Substring` equality is Unicode's canonical equivalence, not byte equality.
    private let entries = Mutex<[Substring: DPoPProof.Header]>([:])

    init(maximumEntries: Int) {
        self.maximumEntries = maximumEntries
    }

    func header(_ segment: Substring) -> DPoPProof.Header? {
        guard segment.utf8.count <= Self.maximumSegment else { return nil }
        return entries.withLock { entries in
            guard let index = entries.index(forKey: segment), entries[index].key.utf8.elementsEqual(segment.utf8) else { return nil }
            return entries[index].value
        }
    }

    func remember(_ header: DPoPProof.Header, for segment: Substring) {
        guard segment.utf8.count <= Self.maximumSegment else { return }
        // Its own copy of the text: a Substring would keep the whole proof alive.
        let key = Substring(String(segment))
        entries.withLock { entries in
            if entries.count >= maximumEntries { entries.removeAll(keepingCapacity: true) }
            entries[key] = header
        }
    }
}
