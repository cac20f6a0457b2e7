public import AsyncHTTPClient
import Foundation
public import GatehouseCore
public import GatehouseRelay
import GatehouseStore
public import GatehouseUpstreams
public import Hummingbird
import HTTPTypes
public import Logging
import NIOCore
import NIOPosix
import ServiceLifecycle

/// Builds and runs the Hummingbird application around a `Gatehouse`.
public enum GatehouseApplication {
    /// The paths Gatehouse answers and the methods each takes (the rest are 404 or 405).
    static let routes: [String: [HTTPRequest.Method]] = [
        "/.well-known/oauth-authorization-server": [.get],
        "/oauth/authorize": [.get],
        "/oauth/callback": [.get],
        "/oauth/token": [.post],
        "/oauth/revoke": [.post],
        "/healthz": [.get],
        "/readyz": [.get],
        "/.well-known/jwks.json": [.get],
        "/userinfo": [.get],
        "/oauth/logout": [.get],
        "/oauth/logout/callback": [.get],
        "/app/auth/callback": [.get],
    ]

    /// The router with every endpoint; in-process tests drive it directly.
    public static func router(for gatehouse: Gatehouse) -> Router<GatehouseRequestContext> {
        let router = Router(context: GatehouseRequestContext.self)
        let centralRoutes = centralAPIRoutes(of: gatehouse)
        let known = routes.merging(centralRoutes.map { ($0.path, [HTTPRequest.Method.post]) }) { first, _ in first }
        router.add(middleware: RequestLogMiddleware(logger: gatehouse.logger, routes: known, configuration: gatehouse.configuration))
        router.add(middleware: RelayMiddleware(gatehouse: gatehouse))
        router.get("/.well-known/oauth-authorization-server") { _, _ in gatehouse.metadata() }
        router.get("/oauth/authorize") { request, _ in await gatehouse.authorize(request) }
        router.get("/oauth/callback") { request, _ in await gatehouse.callback(request) }
        router.post("/oauth/token") { request, _ in await gatehouse.token(request) }
        router.post("/oauth/revoke") { request, _ in await gatehouse.revoke(request) }
        router.get("/healthz") { _, _ in gatehouse.health() }
        router.get("/readyz") { request, _ in await gatehouse.readiness(request) }
        router.get("/.well-known/jwks.json") { request, _ in gatehouse.jwks(request) }
        router.get("/userinfo") { request, _ in await gatehouse.userinfo(request) }
        router.get("/oauth/logout") { request, _ in await gatehouse.logout(request) }
        router.get("/oauth/logout/callback") { request, _ in await gatehouse.logoutCallback(request) }
        router.get("/app/auth/callback") { request, _ in await gatehouse.centralCallback(request) }
        for (path, endpoint, upstream) in centralRoutes {
            router.post(RouterPath(path)) { request, _ in await gatehouse.centralAPI(request, endpoint: endpoint, upstream: upstream) }
        }
        return router
    }

    /// The seed's `/auth/*` endpoints of every `central` upstream with `app_api`.
    static func centralAPIRoutes(of gatehouse: Gatehouse) -> [(path: String, endpoint: Gatehouse.CentralEndpoint, upstream: CentralUpstream)] {
        gatehouse.upstreams.keys.sorted().flatMap { name -> [(path: String, endpoint: Gatehouse.CentralEndpoint, upstream: CentralUpstream)] in
            guard let upstream = gatehouse.centralUpstream(name), let api = upstream.central.appAPI else { return [] }
            return Gatehouse.CentralEndpoint.allCases.map { (api.path + "/" + $0.rawValue, $0, upstream) }
        }
    }

    /// One upstream client per configured upstream, sharing the process's HTTP client.
    public static func upstreamClients(for configuration: GatehouseConfiguration, httpClient: HTTPClient, logger: Logger)
        -> [String: any UpstreamProfile]
    {
        configuration.upstreams.mapValues { UpstreamRegistry.profile(for: $0, httpClient: httpClient, logger: logger) }
    }

    /// Runs `body` with one client per upstream, for commands that are not a server; shuts their HTTP client down after.
    public static func withUpstreamClients<Result: Sendable>(for configuration: GatehouseConfiguration, logger: Logger,
                                                             _ body: ([String: any UpstreamProfile]) async throws -> Result) async throws -> Result {
        let httpClient = makeHTTPClient(for: configuration)
        let outcome: Swift.Result<Result, any Error>
        do {
            outcome = .success(try await body(upstreamClients(for: configuration, httpClient: httpClient, logger: logger)))
        } catch {
            outcome = .failure(error)
        }
        try await httpClient.shutdown()
        return try outcome.get()
    }

    /// The process's one outbound HTTP client: no redirects followed, bounded connect time.
    public static func makeHTTPClient(for configuration: GatehouseConfiguration) -> HTTPClient {
        var clientConfiguration = HTTPClient.Configuration()
        clientConfiguration.redirectConfiguration = .disallow
        let (seconds, attoseconds) = configuration.server.upstreamConnectTimeout.components
        clientConfiguration.timeout.connect = .milliseconds(seconds * 1000 + attoseconds / 1_000_000_000_000_000)
        clientConfiguration.decompression = .disabled
        return HTTPClient(eventLoopGroupProvider: .singleton, configuration: clientConfiguration)
    }

    /// Opens the store, starts the server and runs until SIGTERM or SIGINT, then closes cleanly.
    public static func run(configuration: GatehouseConfiguration, logger: Logger) async throws {
        let opened = try await OpenedStore.open(configuration, logger: logger)
        let store = opened.store
        let httpClient = makeHTTPClient(for: configuration)
        let signer = try await makeSigner(for: configuration, logger: logger)
        let relay = try await makeRelayServices(for: configuration, httpClient: httpClient, signer: signer, logger: logger)
        let profiles = upstreamClients(for: configuration, httpClient: httpClient, logger: logger)
        let nonRefreshing = Set(profiles.filter { !$0.value.canRefresh }.keys)
        let sessions = configuration.sessions.map {
            SessionServices(store: store, settings: $0, logger: logger, nonRefreshingUpstreams: nonRefreshing)
        }
        let revocations: [any Service] = opened.postgres.map {
            [RevocationListener(store: $0, sessions: sessions, identityCache: relay?.cache, logger: logger)]
        } ?? []
        let gatehouse = Gatehouse(configuration: configuration, store: store,
                                  upstreams: profiles,
                                  relay: relay, sessions: sessions, signer: signer, logger: logger)
        let issuer = configuration.server.publicBaseURL
        let fastPath = relay.map { relay in
            (planner: FastRelayPlanner(configuration: configuration, relay: relay, sessions: sessions, logger: logger),
             pool: BackendConnectionPool(group: MultiThreadedEventLoopGroup.singleton,
                                         connectTimeout: .nanoseconds(configuration.server.upstreamConnectTimeout.inNanoseconds)))
        }
        let limiter = ConnectionLimiter(maximum: configuration.server.maximumConnections)
        let headerReadTimeout = TimeAmount.nanoseconds(configuration.server.headerReadTimeout.inNanoseconds)
        let idleTimeout = TimeAmount.nanoseconds(configuration.server.idleTimeout.inNanoseconds)
        let bodyReadTimeout = TimeAmount.nanoseconds(configuration.server.bodyReadTimeout.inNanoseconds)
        var app = Application(
            router: router(for: gatehouse),
            server: .http1(configuration: .init(additionalChannelHandlers: [
                EdgeInstaller(limiter: limiter, logger: logger,
                              edge: { ConnectionEdgeHandler(headerReadTimeout: headerReadTimeout, bodyReadTimeout: bodyReadTimeout,
                                                            idleTimeout: idleTimeout, logger: logger) },
                              fastPath: fastPath.map { fastPath in
                                  { FastRelayHandler(planner: fastPath.planner, pool: fastPath.pool, logger: logger) }
                              }),
            ])),
            configuration: .init(address: .hostname(configuration.server.host, port: configuration.server.port),
                                 serverName: nil),
            services: opened.services + revocations + [ExpirySweeper(store: store, interval: configuration.store.sweepInterval, logger: logger)]
                + (sessions.map { [Reencryption(sessions: $0, interval: configuration.store.sweepInterval, logger: logger)] } ?? []),
            onServerRunning: { channel in
                logger.notice("gatehouse is ready", metadata: [
                    "address": .string(channel.localAddress?.description ?? "?"), "issuer": .string(issuer),
                ])
            },
            logger: logger)
        // The pooled client runs as a service; migrations wait for it, then the server starts.
        app.beforeServerStarts { try await opened.prepare() }
        do {
            try await app.runService()
        } catch {
            try? await relay?.backendClient.shutdown()
            try? await httpClient.shutdown()
            await opened.close()
            throw error
        }
        try await relay?.backendClient.shutdown()
        try await httpClient.shutdown()
        await opened.close()
    }

    /// Gatehouse's signing key, when something needs it: a route with `authorization: assertion`,
    /// a sealed app of an upstream that verifies identity (its ID tokens), or a configured key.
    public static func makeSigner(for configuration: GatehouseConfiguration, logger: Logger) async throws -> AssertionSigner? {
        let sealedIdentity = configuration.clients.values.contains { client in
            client.tokenExposure == .sealed && configuration.upstreams[client.upstream].map(issuesIDTokens) == true
        }
        guard configuration.routes.contains(where: { $0.authorization == .assertion }) || configuration.server.signingKey != nil
            || sealedIdentity else { return nil }
        let issuer = configuration.server.publicBaseURL
        if configuration.server.signingKey == nil, let sessions = configuration.sessions {
            // The same key on every instance and after a restart, so ID tokens given out earlier
            // still name their session at logout; it rotates with the session key ring.
            return try await AssertionSigner(derivingFrom: sessions.keyRing, issuer: issuer)
        }
        if configuration.server.signingKey == nil {
            logger.notice("assertions are signed with a key generated at start; set server.signing_key_file when several instances run")
        }
        return try await AssertionSigner(privateKeyPEM: configuration.server.signingKey, issuer: issuer)
    }

    /// Whether an upstream's sign-ins prove who signed in (OpenID Connect kinds).
    static func issuesIDTokens(_ upstream: UpstreamSettings) -> Bool {
        UpstreamRegistry.kinds[upstream.kind]?.decoder.keepsIdentity == true
    }

    /// The relay's cache, resolvers, backend client and signer; `nil` without routes.
    public static func makeRelayServices(for configuration: GatehouseConfiguration, httpClient: HTTPClient,
                                         signer: AssertionSigner? = nil, logger: Logger) async throws -> RelayServices?
    {
        guard !configuration.routes.isEmpty else { return nil }
        return RelayServices(
            configuration: configuration, cache: IdentityCache(maximumEntries: configuration.identityCache.maximumEntries),
            resolvers: configuration.identityResolvers(client: httpClient),
            backendClient: RelayServices.makeBackendClient(for: configuration), signer: signer)
    }
}
