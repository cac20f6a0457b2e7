public import AsyncHTTPClient
import Foundation
public import GatehouseCore
import GatehouseUpstreams

/// Local validation of JWT access tokens (RFC 9068) against the upstream's JWKS.
///
/// The algorithm is pinned by configuration (RS256 or ES256; never `none`, never HMAC); `iss`,
/// `aud` and `exp` are checked. Keys come from the shared `JWKSCache`: fetched on first use and
/// again when a token names an unknown `kid`, at most once per `refetchInterval`, so a flood of
/// forged kids cannot hammer the JWKS.
public actor JWTResolver: IdentityResolver {
    let settings: IdentitySettings
    let extraction: IdentityExtraction
    let keys: JWKSCache
    /// The configured algorithms Gatehouse verifies access tokens with.
    let algorithms: Set<JWSAlgorithm>

    /// - Parameter upstream: the upstream whose key set this is: its fetches count as its `jwks` calls.
    public init(settings: IdentitySettings, upstream: String, client: HTTPClient, refetchInterval: Duration = .seconds(30)) {
        let fetch = JWKSCache.httpFetcher(client: client, timeout: settings.timeout, telemetry: UpstreamTelemetry(upstream: upstream))
        self.init(settings: settings, keys: JWKSCache(url: settings.url, refetchInterval: refetchInterval, fetch: fetch))
    }

    init(settings: IdentitySettings, keys: JWKSCache) {
        self.settings = settings
        self.extraction = IdentityExtraction(settings: settings, defaultSubjectPaths: ["/sub"])
        self.keys = keys
        self.algorithms = Set(settings.algorithms.compactMap { JWSAlgorithm(rawValue: $0) }.filter { $0 != .hs256 })
    }

    /// The access tokens Gatehouse mints for an upstream: RS256 with its own keys (an in-process
    /// key set, never fetched), its own issuer and audience.
    static func minted(by keys: MintedTokenVerification, settings: IdentitySettings) -> JWTResolver {
        var settings = settings
        settings.issuer = keys.issuer
        settings.audience = keys.audience
        settings.algorithms = ["RS256"]
        let document = keys.jwksDocument
        // Read again for every unknown kid (no throttle: nothing is fetched), so an unknown kid is
        // always a forgery answered 401, never "the key set may have rotated, try later" (503).
        return JWTResolver(settings: settings, keys: JWKSCache(url: "gatehouse:minted", refetchInterval: .zero, fetch: { _ in (200, document) }))
    }

    public nonisolated func resolve(token: String) async throws(IdentityUnavailable) -> IdentityResolution {
        let jws: CompactJWS
        do throws(JOSEError) {
            jws = try CompactJWS(token)
        } catch {
            return .inactive
        }
        guard let algorithm = JWSAlgorithm(rawValue: jws.header.algorithm), algorithms.contains(algorithm) else { return .inactive }

        let lookup: JWKSCache.KeyLookup
        do throws(JOSEError) {
            lookup = try await keys.lookup(keyID: jws.header.keyID, algorithm: algorithm)
        } catch {
            throw IdentityUnavailable(.unreachable, error.detail)
        }
        let candidates: [JWKSCache.Key]
        switch lookup {
        case .found(let found):
            candidates = found
        case .unknown(refetched: true), .unusable:
            // Just fetched and still unknown: a forged kid.
            return .inactive
        case .unknown(refetched: false):
            // Not fetched (throttled): the upstream may have rotated its keys; say "try later"
            // rather than sign anyone out.
            throw IdentityUnavailable(.badResponse, "the token names a key the JWKS did not have at its last fetch")
        }
        let verified: VerifiedJWS
        do throws(JOSEError) {
            verified = try JWSVerifier.verify(jws, algorithm: algorithm, candidates: candidates)
        } catch {
            return .inactive
        }

        guard let claims = (try? JSONSerialization.jsonObject(with: verified.payload)) as? [String: Any] else { return .inactive }
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
}
