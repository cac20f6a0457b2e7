public import AsyncHTTPClient
public import GatehouseCore
public import GatehouseRelay
import NIOCore
import NIOHTTP1

/// What the resource relay needs beside the configuration: the identity cache, one resolver
/// per upstream with an identity service, the HTTP client toward backends and, for routes
/// with `authorization: assertion`, the signer.
public struct RelayServices: Sendable {
    public let cache: IdentityCache
    public let resolvers: [String: any IdentityResolver]
    public let backendClient: HTTPClient
    public let signer: AssertionSigner?
    /// Every identity header name of every route, lower-cased: stripped from all relayed requests.
    let identityHeaderNames: Set<String>
    /// `X-Forwarded-Proto` and `X-Forwarded-Host`, from the public base URL.
    let forwardedProto: String
    let forwardedHost: String

    public init(configuration: GatehouseConfiguration, cache: IdentityCache, resolvers: [String: any IdentityResolver],
                backendClient: HTTPClient, signer: AssertionSigner?) {
        self.cache = cache
        self.resolvers = resolvers
        self.backendClient = backendClient
        self.signer = signer
        self.identityHeaderNames = Set(configuration.routes.flatMap { $0.identityHeaders.map { $0.name.lowercased() } })
        let base = configuration.server.publicBaseURL
        self.forwardedProto = base.hasPrefix("https://") ? "https" : "http"
        self.forwardedHost = base.split(separator: "/", omittingEmptySubsequences: true).dropFirst().first.map(String.init) ?? ""
    }

    /// `Forwarded` (RFC 7239), `X-Forwarded-*`, `X-Request-Id` and `Via`, as both relay paths set them.
    func addForwardingHeaders(to headers: inout HTTPHeaders, remoteAddress: String?, requestID: String) {
        if let remoteAddress {
            headers.add(name: "X-Forwarded-For", value: remoteAddress)
            let node = remoteAddress.contains(":") ? "\"[\(remoteAddress)]\"" : remoteAddress
            headers.add(name: "Forwarded", value: "for=\(node);proto=\(forwardedProto);host=\"\(forwardedHost)\"")
        } else {
            headers.add(name: "Forwarded", value: "proto=\(forwardedProto);host=\"\(forwardedHost)\"")
        }
        headers.add(name: "X-Forwarded-Proto", value: forwardedProto)
        headers.add(name: "X-Forwarded-Host", value: forwardedHost)
        headers.add(name: "X-Request-Id", value: requestID)
        headers.add(name: "Via", value: "1.1 gatehouse")
    }

    /// The HTTP client toward backends: a large keep-alive pool, no redirects, no decompression.
    public static func makeBackendClient(for configuration: GatehouseConfiguration) -> HTTPClient {
        var settings = HTTPClient.Configuration()
        settings.redirectConfiguration = .disallow
        settings.decompression = .disabled
        settings.connectionPool = .init(idleTimeout: .seconds(60), concurrentHTTP1ConnectionsPerHostSoftLimit: 512)
        let (seconds, attoseconds) = configuration.server.upstreamConnectTimeout.components
        settings.timeout.connect = .milliseconds(seconds * 1000 + attoseconds / 1_000_000_000_000_000)
        let longest = configuration.routes.map(\.timeout).max() ?? .seconds(30)
        settings.timeout.read = .seconds(longest.components.seconds + 1)
        return HTTPClient(eventLoopGroupProvider: .singleton, configuration: settings)
    }
}
