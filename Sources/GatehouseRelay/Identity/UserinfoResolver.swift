public import AsyncHTTPClient
public import NIOSSL
import Foundation
import NIOHTTP1
public import GatehouseCore

/// OpenID Connect userinfo (OIDC Core §5.3): a JSON answer for a live token, 401 for a dead one.
public struct UserinfoResolver: IdentityResolver {
    let settings: IdentitySettings
    let http: IdentityHTTP
    let extraction: IdentityExtraction

    /// - Parameters:
    ///   - upstream: the upstream whose identity service this is (metrics, spans).
    ///   - concurrency: calls in flight at most toward the service (`identity_concurrency`).
    public init(settings: IdentitySettings, upstream: String, client: HTTPClient, concurrency: Int, tls: TLSConfiguration? = nil) {
        self.init(settings: settings,
                  http: IdentityHTTP(upstream: upstream, timeout: settings.timeout, concurrency: concurrency, client: client, tls: tls))
    }

    init(settings: IdentitySettings, http: IdentityHTTP) {
        self.settings = settings
        self.http = http
        self.extraction = IdentityExtraction(settings: settings, defaultSubjectPaths: ["/sub"])
    }

    public func resolve(token: String) async throws(IdentityUnavailable) -> IdentityResolution {
        var request = HTTPClientRequest(url: settings.url)
        request.headers.add(name: "Authorization", value: "Bearer \(token)")
        request.headers.add(name: "Accept", value: "application/json")
        let (status, body) = try await http.send(request)
        switch status {
        case 200: return .active(extraction.identity(fromJSON: try IdentityHTTP.json(body), expiresAt: nil))
        case 401, 403: return .inactive
        default: throw IdentityUnavailable(.badResponse, "the userinfo endpoint answered HTTP \(status)")
        }
    }
}
