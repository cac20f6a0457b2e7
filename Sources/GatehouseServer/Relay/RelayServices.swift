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
    /// `Forwarded`, `X-Forwarded-*`, `Via` and request ids, as both relay paths add them.
    let forwarding: RelayForwarding
    /// Each route's backend and header policy, by prefix, built once.
    let backends: [String: RouteBackend]
    let policies: [String: RelayHeaderPolicy]

    public init(configuration: GatehouseConfiguration, cache: IdentityCache, resolvers: [String: any IdentityResolver],
                backendClient: HTTPClient, signer: AssertionSigner?) {
        self.cache = cache
        self.resolvers = resolvers
        self.backendClient = backendClient
        self.signer = signer
        // Every identity header of every route is stripped from every relayed request.
        let identityHeaderNames = Set(configuration.routes.flatMap { $0.identityHeaders.map { $0.name.lowercased() } })
        self.forwarding = RelayForwarding(publicBaseURL: configuration.server.publicBaseURL)
        var backends: [String: RouteBackend] = [:]
        var policies: [String: RelayHeaderPolicy] = [:]
        for route in configuration.routes {
            backends[route.prefix] = RouteBackend(url: route.backend)
            policies[route.prefix] = RelayHeaderPolicy(route: route, allIdentityHeaders: identityHeaderNames)
        }
        self.backends = backends
        self.policies = policies
    }

    /// The HTTP client toward backends: a large keep-alive pool, no redirects, no decompression,
    /// and none of AsyncHTTPClient's own spans (they record the full URL, query included, and
    /// add a second `traceparent`): the relay makes its `backend` span and injects its context.
    public static func makeBackendClient(for configuration: GatehouseConfiguration) -> HTTPClient {
        var settings = HTTPClient.Configuration()
        settings.tracing.tracer = nil
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
