public import AsyncHTTPClient
public import GatehouseCore
public import GatehouseRelay
import NIOCore
import NIOHTTP1
import NIOSSL

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
    /// Each https route's TLS toward its backend, by prefix (both paths use it).
    let backendTLS: [String: BackendTLS]

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
        var backendTLS: [String: BackendTLS] = [:]
        for route in configuration.routes {
            let backend = RouteBackend(url: route.backend)
            backends[route.prefix] = backend
            policies[route.prefix] = RelayHeaderPolicy(route: route, allIdentityHeaders: identityHeaderNames)
            if let backend, backend.isTLS { backendTLS[route.prefix] = BackendTLS(route: route, backend: backend) }
        }
        self.backends = backends
        self.policies = policies
        self.backendTLS = backendTLS
    }

    /// The HTTP client toward backends: a large keep-alive pool, no redirects, no decompression,
    /// and none of AsyncHTTPClient's own spans (they record the full URL, query included, and
    /// add a second `traceparent`): the relay makes its `backend` span and injects its context.
    public static func makeBackendClient(for configuration: GatehouseConfiguration) -> HTTPClient {
        var settings = HTTPClient.Configuration()
        settings.tracing.tracer = nil
        settings.redirectConfiguration = .disallow
        settings.decompression = .disabled
        settings.connectionPool = .outageSafe(idleTimeout: .seconds(60), connectionsPerHost: 512)
        let (seconds, attoseconds) = configuration.server.upstreamConnectTimeout.components
        settings.timeout.connect = .milliseconds(seconds * 1000 + attoseconds / 1_000_000_000_000_000)
        let longest = configuration.routes.map(\.timeout).max() ?? .seconds(30)
        settings.timeout.read = .seconds(longest.components.seconds + 1)
        return HTTPClient(eventLoopGroupProvider: .singleton, configuration: settings)
    }
}

/// TLS toward one route's https backend: the certificate is checked against the system's roots,
/// or against `backend_ca_file`'s certificates only, and must name the URL's host (or, for an IP
/// address, that address). `context` is the fast path's (one per route, shared by its pooled
/// connections); the general path hands `configuration` to AsyncHTTPClient.
struct BackendTLS: Sendable {
    let configuration: TLSConfiguration
    /// `nil` when the trust roots cannot be loaded: the fast path then leaves the route to the
    /// general path, whose client fails the same way (502).
    let context: NIOSSLContext?
    /// The name sent as SNI and checked against the certificate; `nil` for an IP address,
    /// checked against the connection's remote address instead.
    let serverHostname: String?
    /// The fast path's pool key: connections made with this route's trust roots only.
    let poolKey: String

    init(route: RouteSettings, backend: RouteBackend) {
        var configuration = TLSConfiguration.makeClientConfiguration()
        if let pem = route.backendTrustRootsPEM {
            let certificates = (try? NIOSSLCertificate.fromPEMBytes(Array(pem.utf8))) ?? []
            configuration.trustRoots = .certificates(certificates)
        }
        self.configuration = configuration
        self.context = try? NIOSSLContext(configuration: configuration)
        let isAddress = (try? SocketAddress(ipAddress: backend.host, port: backend.port)) != nil
        self.serverHostname = isAddress ? nil : backend.host
        // Connections checked against other roots are never shared: a reload that changes a
        // route's certificates starts new connections (routes with the same file share them).
        self.poolKey = "https://\(backend.key)" + (route.backendTrustRootsPEM.map { " " + SecureToken.hash($0).prefix(16) } ?? "")
    }
}
