public import Foundation
public import GatehouseCore

/// The userinfo answer of a sign-in (OpenID Connect Core §5.3.2): JSON, or a JWT signed with the
/// pinned algorithm (`application/jwt`), whose `sub` must be the ID token's.
public enum UserinfoVerifier {
    /// The claims JSON exactly as the upstream gave it: the body for `application/json`, the
    /// payload bytes for `application/jwt`.
    public static func verify(body: Data, contentType: String?, expectedSubject: String, algorithm: JWSAlgorithm,
                              issuer: String, clientID: String, keys: JWKSCache?, hmacSecret: Secret?)
        async throws(JOSEError) -> Data
    {
        let mediaType = contentType.map {
            String($0.split(separator: ";", maxSplits: 1, omittingEmptySubsequences: false)[0])
                .trimmingCharacters(in: .whitespaces).lowercased()
        }
        let claims: [String: JSONValue]
        let bytes: Data
        switch mediaType {
        case "application/jwt"?:
            let compact = String(decoding: body, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
            let verified: VerifiedJWS
            do throws(JOSEError) {
                verified = try await JWSVerifier.verify(compact, algorithm: algorithm, keys: keys, hmacSecret: hmacSecret)
            } catch {
                if error.unavailable { throw error }
                throw JOSEError(check: "userinfo signature", detail: "\(error.check): \(error.detail)")
            }
            if let iss = verified.claims["iss"], iss.stringValue != issuer {
                throw JOSEError(check: "iss", detail: "the userinfo JWT's iss is not the upstream's issuer")
            }
            if let aud = verified.claims["aud"] {
                let audiences = aud.arrayValue?.compactMap(\.stringValue) ?? [aud.stringValue].compactMap { $0 }
                guard audiences.contains(clientID) else {
                    throw JOSEError(check: "aud", detail: "the userinfo JWT's aud does not name Gatehouse's client_id")
                }
            }
            claims = verified.claims
            bytes = verified.payload
        case "application/json"?, nil:
            guard let object = JSONValue.parseObject(body) else {
                throw JOSEError(check: "malformed", detail: "the userinfo answer is not a JSON object")
            }
            claims = object
            bytes = body
        default:
            throw JOSEError(check: "malformed", detail: "the userinfo answer is neither application/json nor application/jwt")
        }
        guard let subject = claims["sub"]?.stringValue, subject == expectedSubject else {
            throw JOSEError(check: "userinfo sub", detail: "the userinfo sub is not the ID token's sub")
        }
        return bytes
    }
}
