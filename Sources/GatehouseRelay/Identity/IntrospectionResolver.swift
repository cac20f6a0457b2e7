public import AsyncHTTPClient
public import NIOSSL
import Foundation
import NIOHTTP1
public import GatehouseCore
import GatehouseUpstreams
import NIOCore

/// RFC 7662 token introspection, authenticated with the upstream's own client credentials.
public struct IntrospectionResolver: IdentityResolver {
    let settings: IdentitySettings
    let upstream: UpstreamSettings
    let http: IdentityHTTP
    let extraction: IdentityExtraction

    /// - Parameters:
    ///   - concurrency: calls in flight at most toward the endpoint (`identity_concurrency`).
    ///   - tls: the upstream's `ca_file` and client certificate (`UpstreamSettings.tlsConfiguration()`).
    public init(settings: IdentitySettings, upstream: UpstreamSettings, client: HTTPClient, concurrency: Int, tls: TLSConfiguration? = nil) {
        self.init(settings: settings, upstream: upstream,
                  http: IdentityHTTP(upstream: upstream.name, timeout: settings.timeout, concurrency: concurrency, client: client, tls: tls))
    }

    init(settings: IdentitySettings, upstream: UpstreamSettings, http: IdentityHTTP) {
        self.settings = settings
        self.upstream = upstream
        self.http = http
        self.extraction = IdentityExtraction(settings: settings, defaultSubjectPaths: ["/sub", "/username"])
    }

    public func resolve(token: String) async throws(IdentityUnavailable) -> IdentityResolution {
        let request: HTTPClientRequest
        do throws(OAuthError) {
            // An assertion names the introspection endpoint (or the issuer), never the token endpoint.
            request = try upstream.authenticatedForm(url: settings.url, [("token", token), ("token_type_hint", "access_token")],
                                                     tokenEndpoint: upstream.profile.configuredTokenEndpoint)
        } catch {
            throw IdentityUnavailable(.badResponse, error.detail)
        }
        let (status, body) = try await http.send(request)
        guard status == 200 else {
            // The introspection endpoint refusing Gatehouse says nothing about the app's token.
            throw IdentityUnavailable(.badResponse, "the introspection endpoint answered HTTP \(status)")
        }
        let object = try IdentityHTTP.json(body)
        guard object["active"] as? Bool == true else { return .inactive }
        let expiresAt = (object["exp"] as? NSNumber).map { Date(timeIntervalSince1970: $0.doubleValue) }
        if let expiresAt, expiresAt <= Date() { return .inactive }
        return .active(extraction.identity(fromJSON: object, expiresAt: expiresAt))
    }
}
