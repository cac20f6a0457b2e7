public import AsyncHTTPClient
import Foundation
import NIOHTTP1
public import GatehouseCore
import JWTKit
import NIOCore

/// Local validation of JWT access tokens (RFC 9068) against the upstream's JWKS.
///
/// The algorithm is pinned by configuration (never `none`, never HMAC); `iss`, `aud` and
/// `exp` are checked. Keys are fetched on first use and again when a token names an unknown
/// `kid`, at most once per `refetchInterval`, so a flood of forged kids cannot hammer the JWKS.
public actor JWTResolver: IdentityResolver {
    let settings: IdentitySettings
    let client: HTTPClient
    let extraction: IdentityExtraction
    let refetchInterval: Duration
    private var keys: JWTKeyCollection?
    private var knownKids: Set<String> = []
    private var lastFetch: ContinuousClock.Instant?

    public init(settings: IdentitySettings, client: HTTPClient, refetchInterval: Duration = .seconds(30)) {
        self.settings = settings
        self.client = client
        self.extraction = IdentityExtraction(settings: settings, defaultSubjectPaths: ["/sub"])
        self.refetchInterval = refetchInterval
    }

    public func resolve(token: String) async throws(IdentityUnavailable) -> IdentityResolution {
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3,
              let headerData = Base64URL.decode(String(parts[0])),
              let header = (try? JSONSerialization.jsonObject(with: headerData)) as? [String: Any],
              let algorithm = header["alg"] as? String, settings.algorithms.contains(algorithm),
              let kid = header["kid"] as? String,
              let payloadData = Base64URL.decode(String(parts[1])),
              let claims = (try? JSONSerialization.jsonObject(with: payloadData)) as? [String: Any]
        else { return .inactive }

        let collection = try await keys(including: kid)
        guard knownKids.contains(kid) else {
            // Just fetched and still unknown: a forged kid. Not fetched (throttled): the upstream
            // may have rotated its keys; say "try later" rather than sign anyone out.
            if let lastFetch, ContinuousClock.now - lastFetch < .milliseconds(100) { return .inactive }
            throw IdentityUnavailable(.badResponse, "the token names a key the JWKS did not have at its last fetch")
        }
        do {
            _ = try await collection.verify(token, as: SignatureOnly.self)
        } catch {
            return .inactive
        }
        guard let exp = (claims["exp"] as? NSNumber)?.doubleValue, Date(timeIntervalSince1970: exp) > Date() else { return .inactive }
        if let issuer = settings.issuer, claims["iss"] as? String != issuer { return .inactive }
        if let audience = settings.audience {
            let audiences = (claims["aud"] as? [String]) ?? [(claims["aud"] as? String)].compactMap { $0 }
            guard audiences.contains(audience) else { return .inactive }
        }
        var object = claims
        if object["scope"] == nil, let scp = claims["scp"] { object["scope"] = scp }
        return .active(extraction.identity(fromJSON: object, expiresAt: Date(timeIntervalSince1970: exp)))
    }

    private func keys(including kid: String) async throws(IdentityUnavailable) -> JWTKeyCollection {
        if let keys, knownKids.contains(kid) { return keys }
        if let keys, let lastFetch, ContinuousClock.now - lastFetch < refetchInterval { return keys }
        lastFetch = .now
        var request = HTTPClientRequest(url: settings.url)
        request.headers.add(name: "Accept", value: "application/json")
        let (status, body) = try await IdentityHTTP.send(request, timeout: settings.timeout, client: client)
        guard status == 200, let json = String(data: body, encoding: .utf8) else {
            throw IdentityUnavailable(.badResponse, "the JWKS endpoint answered HTTP \(status)")
        }
        let collection = JWTKeyCollection()
        do {
            let jwks = try JSONDecoder().decode(JWKS.self, from: Data(json.utf8))
            for key in jwks.keys where key.keyIdentifier != nil {
                // Keys of a type Gatehouse does not verify with are skipped, not fatal.
                _ = try? await collection.add(jwk: key)
            }
            knownKids = Set(jwks.keys.compactMap { $0.keyIdentifier?.string })
        } catch {
            throw IdentityUnavailable(.badResponse, "the JWKS endpoint's answer is not a key set")
        }
        keys = collection
        return collection
    }
}

/// Signature check only: the claims are checked from the raw payload above.
private struct SignatureOnly: JWTPayload {
    init(from decoder: any Decoder) throws {}
    func encode(to encoder: any Encoder) throws {}
    func verify(using algorithm: some JWTAlgorithm) async throws {}
}
