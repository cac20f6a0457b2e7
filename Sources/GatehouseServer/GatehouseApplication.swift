public import AsyncHTTPClient
import Foundation
public import GatehouseCore
public import GatehouseRelay
import GatehouseSessions
import GatehouseStore
public import GatehouseUpstreams
public import Hummingbird
import HTTPTypes
public import Logging
import NIOCore
import NIOPosix
import Prometheus
import ServiceLifecycle

/// Builds and runs the Hummingbird application around a `Gatehouse`.
public enum GatehouseApplication {
    /// One endpoint: its method and path, and what answers it with the `Gatehouse` in force.
    struct Endpoint: Sendable {
        let method: HTTPRequest.Method
        let path: String
        let answer: @Sendable (Request, GatehouseRequestContext, Gatehouse) async -> Response

        init(_ method: HTTPRequest.Method, _ path: String,
             _ answer: @escaping @Sendable (Request, GatehouseRequestContext, Gatehouse) async -> Response) {
            self.method = method
            self.path = path
            self.answer = answer
        }
    }

    /// Every endpoint Gatehouse answers, written once: the router is built from it, and the
    /// request log and its 404/405 from the paths and methods it lists. What the upstream kinds
    /// contribute (a sign-in's way back, an app face) comes from their profiles; a reload never
    /// changes upstreams, so the endpoints of the first `Gatehouse` are those of every later one.
    static func endpoints(of gatehouse: Gatehouse, readiness: Readiness, metrics: PrometheusCollectorRegistry?) -> [Endpoint] {
        // The authorization server face, and the process's own endpoints: always.
        var endpoints: [Endpoint] = [
            Endpoint(.get, "/.well-known/oauth-authorization-server") { _, _, gatehouse in gatehouse.authorizationServer.metadata() },
            Endpoint(.get, "/.well-known/openid-configuration") { _, _, gatehouse in gatehouse.authorizationServer.metadata(openID: true) },
            Endpoint(.get, "/oauth/authorize") { request, _, gatehouse in await gatehouse.authorizationServer.authorize(request) },
            Endpoint(.get, "/oauth/callback") { request, _, gatehouse in await gatehouse.authorizationServer.callback(request) },
            Endpoint(.post, "/oauth/token") { request, context, gatehouse in
                await gatehouse.authorizationServer.token(request, peer: context.remoteAddress)
            },
            Endpoint(.post, "/oauth/revoke") { request, _, gatehouse in await gatehouse.authorizationServer.revoke(request) },
            Endpoint(.get, "/.well-known/jwks.json") { _, _, gatehouse in gatehouse.authorizationServer.jwks() },
            Endpoint(.get, "/oauth/logout") { request, _, gatehouse in await gatehouse.authorizationServer.logout(request) },
            Endpoint(.get, "/oauth/logout/callback") { request, _, gatehouse in await gatehouse.authorizationServer.logoutCallback(request) },
            Endpoint(.get, "/healthz") { _, _, gatehouse in gatehouse.health() },
            Endpoint(.get, "/readyz") { request, _, gatehouse in
                // From SIGTERM on, load balancers are told to stop sending; requests are still served.
                readiness.isDraining ? Response.problem(.shuttingDown(), for: request) : await gatehouse.readiness(request)
            },
        ]
        // A sign-in that comes back by a path of its kind's (`SignInReturn.cookie`).
        let profiles = gatehouse.upstreams.keys.sorted().compactMap { gatehouse.upstreams[$0] }
        var cookiePaths: Set<String> = []
        for profile in profiles {
            if case .cookie(let path) = profile.signInReturn, cookiePaths.insert(path).inserted {
                endpoints.append(Endpoint(.get, path) { request, _, gatehouse in
                    await gatehouse.authorizationServer.cookieCallback(request, path: path)
                })
            }
        }
        // The public keys Gatehouse authenticates to an upstream with (`private_key_jwt`, a
        // self-signed client certificate), for upstreams that read a client's keys from its `jwks_uri`.
        for profile in profiles {
            guard let path = profile.settings.publishedKeysPath else { continue }
            let document = profile.settings.publishedKeysDocument
            endpoints.append(Endpoint(.get, path) { _, _, _ in
                var response = Response.json(bytes: document)
                response.headers[.cacheControl] = "public, max-age=300"
                return response
            })
        }
        // Sealed sessions, with a `sessions` section (which a reload never changes), and the app
        // faces of the kinds that keep their people in them.
        if gatehouse.sealedSessions != nil {
            endpoints += [
                Endpoint(.get, "/userinfo") { request, _, gatehouse in await gatehouse.sealedSessions.answer(request) { await $0.userinfo(request) } },
                Endpoint(.post, "/oauth/session_code") { request, _, gatehouse in
                    await gatehouse.sealedSessions.answer(request) { await $0.sessionCode(request) }
                },
                Endpoint(.get, "/session") { request, _, gatehouse in await gatehouse.sealedSessions.answer(request) { await $0.openWebSession(request) } },
            ]
            for profile in profiles {
                for route in profile.appRoutes {
                    // The route's profile is the one in force: a reload keeps the profiles.
                    endpoints.append(Endpoint(.post, route.path) { request, context, gatehouse in
                        await gatehouse.sealedSessions.answer(request) { await $0.appRoute(route, request: request, peer: context.remoteAddress) }
                    })
                }
            }
        }
        // In-app sign-in: known from the start (a reload may turn it on for an app); 404 while no app has it.
        endpoints.append(Endpoint(.post, InAppSignIn.path) { request, context, gatehouse in
            await gatehouse.inAppSignIn.answer(request) { await $0.challenge(request, peer: context.remoteAddress) }
        })
        // App instances: their endpoints are known from the start, since a reload may add the first
        // app with `instances`; while none has them, a POST to them is answered 404.
        endpoints += [
            Endpoint(.post, "/oauth/register") { request, context, gatehouse in
                await gatehouse.appInstances.answer(request) { await $0.register(request, peer: context.remoteAddress) }
            },
            Endpoint(.post, "/oauth/attestation/challenge") { request, _, gatehouse in
                await gatehouse.appInstances.answer(request) { await $0.attestationChallenge(request) }
            },
            Endpoint(.post, "/oauth/attestation") { request, _, gatehouse in await gatehouse.appInstances.answer(request) { await $0.attestation(request) } },
            Endpoint(.post, "/oauth/certify") { request, _, gatehouse in await gatehouse.appInstances.answer(request) { await $0.certify(request) } },
            Endpoint(.post, "/oauth/certify/allow") { request, _, gatehouse in
                await gatehouse.appInstances.answer(request) { await $0.certifyAllow(request) }
            },
        ]
        let metricsAllowed = gatehouse.configuration.operations.metrics?.allow ?? []
        if let metrics, !metricsAllowed.isEmpty {
            endpoints.append(Endpoint(.get, "/metrics") { request, context, gatehouse in
                // Only to the configured addresses, asking directly: a request a proxy forwards
                // (a trusted proxy's, or one with forwarding headers) comes from someone else,
                // maybe the internet. To anyone else there is nothing here.
                let trusted = gatehouse.configuration.operations.rateLimits.trustedProxies
                guard let peer = context.remoteAddress, metricsAllowed.contains(where: { $0.contains(peer) }),
                      !trusted.contains(where: { $0.contains(peer) }),
                      !Self.forwardingHeaders.contains(where: { !request.headers[values: $0].isEmpty })
                else {
                    return Response.problem(.notFound(), for: request)
                }
                return MetricsExport.response(metrics)
            })
        }
        return endpoints
    }

    /// The router with every endpoint; in-process tests drive it directly.
    public static func router(for gatehouse: Gatehouse) -> Router<GatehouseRequestContext> {
        router(holder: GatehouseHolder(gatehouse))
    }

    /// The router, reading the `Gatehouse` in force from `holder` once per request (SIGHUP swaps it).
    /// `metrics`: the registry `/metrics` reads when `observability.metrics.allow` opens it on this port;
    /// `accessLog`: where each request's line goes.
    static func router(holder: GatehouseHolder, readiness: Readiness = Readiness(), metrics: PrometheusCollectorRegistry? = nil,
                       accessLog: AccessLog = .throughLogger) -> Router<GatehouseRequestContext> {
        let router = Router(context: GatehouseRequestContext.self)
        let gatehouse = holder.current
        let endpoints = endpoints(of: gatehouse, readiness: readiness, metrics: metrics)
        let known = Dictionary(endpoints.map { ($0.path, [$0.method]) }, uniquingKeysWith: +)
        router.add(middleware: RequestLogMiddleware(logger: gatehouse.logger, routes: known, holder: holder, accessLog: accessLog))
        router.add(middleware: RateLimitMiddleware(holder: holder))
        router.add(middleware: RelayMiddleware(holder: holder))
        for endpoint in endpoints {
            router.on(RouterPath(endpoint.path), method: endpoint.method) { request, context in
                await endpoint.answer(request, context, holder.current)
            }
        }
        return router
    }

    /// Headers by which a proxy or CDN says it is relaying someone else's request: any of them
    /// on a `/metrics` request means the peer is not the asker.
    static let forwardingHeaders: [HTTPField.Name] = [
        "X-Forwarded-For", "Forwarded", "X-Real-IP", "True-Client-IP", "CF-Connecting-IP", "X-Client-IP", "Via",
        "X-Forwarded-Host", "X-Forwarded-Proto", "X-Cluster-Client-IP", "Fastly-Client-IP", "X-Original-Forwarded-For",
        "Client-IP", "X-ProxyUser-IP",
    ].map { HTTPField.Name($0)! }

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

    /// The process's one outbound HTTP client: no redirects followed, bounded connect time,
    /// no connection retries of its own (`outageSafe`).
    public static func makeHTTPClient(for configuration: GatehouseConfiguration) -> HTTPClient {
        var clientConfiguration = HTTPClient.Configuration()
        clientConfiguration.connectionPool = .outageSafe(idleTimeout: .seconds(60), connectionsPerHost: 8)
        clientConfiguration.redirectConfiguration = .disallow
        let (seconds, attoseconds) = configuration.server.upstreamConnectTimeout.components
        clientConfiguration.timeout.connect = .milliseconds(seconds * 1000 + attoseconds / 1_000_000_000_000_000)
        clientConfiguration.decompression = .disabled
        // Gatehouse makes its own client spans (no URL, no query: they can hold codes and tokens) and
        // injects `traceparent` once; AsyncHTTPClient's own tracing would add a second of each.
        clientConfiguration.tracing.tracer = nil
        return HTTPClient(eventLoopGroupProvider: .singleton, configuration: clientConfiguration)
    }

    /// Opens the store, starts the server and runs until SIGTERM or SIGINT, then drains and closes
    /// cleanly (`Lifecycle`); SIGHUP reloads `configurationPath` (clients, routes, rate limits).
    /// `accessLog`: what `GatehouseLogging.bootstrap` made, used unless `observability.access_log`
    /// is off (read at start: a reload never changes it).
    public static func run(configuration: GatehouseConfiguration, source: ConfigurationSource? = nil, configurationPath: String? = nil,
                           logger: Logger, accessLog: AccessLog = .throughLogger) async throws {
        let accessLog = accessLog.applying(configuration.operations.accessLog)
        // Metrics and traces first: handles made from here on report to them.
        let registry = configuration.operations.metrics.map { _ in MetricsExport.bootstrap() }
        let tracing = try configuration.operations.tracing.map(TracingExport.bootstrap)
        let opened = try await OpenedStore.open(configuration, logger: logger)
        let store = opened.store
        let httpClient = makeHTTPClient(for: configuration)
        let signer = try await makeSigner(for: configuration, logger: logger)
        let profiles = upstreamClients(for: configuration, httpClient: httpClient, logger: logger)
        let nonRefreshing = Set(profiles.filter { !$0.value.canRefresh }.keys)
        let sessions = configuration.sessions.map {
            SessionServices(store: store, settings: $0, logger: logger, nonRefreshingUpstreams: nonRefreshing)
        }
        // What outlives a configuration, made once: every Gatehouse a reload builds stands on it.
        let runtime = GatehouseRuntime(configuration: configuration, store: store, upstreams: profiles, httpClient: httpClient,
                                       sessions: sessions, signer: signer, logger: logger)
        let revocations: [any Service] = opened.postgres.map {
            [RevocationListener(store: $0, sessions: sessions, identityCache: runtime.identityCache, logger: logger)]
        } ?? []
        let holder = GatehouseHolder(Gatehouse(configuration: configuration, runtime: runtime))
        let readiness = Readiness()
        let pool = BackendConnectionPool(group: MultiThreadedEventLoopGroup.singleton,
                                         connectTimeout: .nanoseconds(configuration.server.upstreamConnectTimeout.inNanoseconds))
        let reloader = Reloader(holder: holder, source: source, logger: logger)
        let issuer = configuration.server.publicBaseURL
        let limiter = ConnectionLimiter(maximum: configuration.server.maximumConnections)
        let headerReadTimeout = TimeAmount.nanoseconds(configuration.server.headerReadTimeout.inNanoseconds)
        let idleTimeout = TimeAmount.nanoseconds(configuration.server.idleTimeout.inNanoseconds)
        let bodyReadTimeout = TimeAmount.nanoseconds(configuration.server.bodyReadTimeout.inNanoseconds)
        var app = Application(
            router: router(holder: holder, readiness: readiness, metrics: registry, accessLog: accessLog),
            server: .http1(configuration: .init(additionalChannelHandlers: [
                EdgeInstaller(limiter: limiter, logger: logger,
                              edge: { ConnectionEdgeHandler(headerReadTimeout: headerReadTimeout, bodyReadTimeout: bodyReadTimeout,
                                                            idleTimeout: idleTimeout, logger: logger) },
                              fastPath: { FastRelayHandler(planner: holder, pool: pool, logger: logger, accessLog: accessLog) }),
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
        var observability: [any Service] = tracing.map { [$0] } ?? []
        if let registry, let metrics = configuration.operations.metrics, let host = metrics.listenHost, let port = metrics.listenPort {
            observability.append(MetricsExport.listener(host: host, port: port, registry: registry, logger: logger))
        }
        let lifecycle = Lifecycle(readiness: readiness, drain: configuration.server.shutdownDrain, logger: logger) {
            guard let configurationPath else {
                return logger.warning("configuration reload refused: no configuration file to read")
            }
            await reloader.reload(from: configurationPath)
        }
        let stopped: Result<Void, any Error>
        do {
            try await lifecycle.run(app, beside: observability, timeout: configuration.server.shutdownTimeout)
            stopped = .success(())
        } catch {
            stopped = .failure(error)
        }
        // The server has stopped: the lines of its last requests are written before the process ends.
        await accessLog.flush()
        await close(runtime, httpClient: httpClient, store: opened)
        try stopped.get()
    }

    private static func close(_ runtime: GatehouseRuntime, httpClient: HTTPClient, store: OpenedStore) async {
        try? await runtime.shutdown()
        try? await httpClient.shutdown()
        await store.close()
    }

    /// The fast path's planner for `gatehouse`; `nil` without routes.
    static func fastRelayPlanner(for gatehouse: Gatehouse) -> FastRelayPlanner? {
        gatehouse.relay.map { relay in
            FastRelayPlanner(configuration: gatehouse.configuration, relay: relay, sessions: gatehouse.sessions, limits: gatehouse.limits,
                             dpop: gatehouse.dpop, tracingEnabled: gatehouse.configuration.operations.tracing != nil, logger: gatehouse.logger)
        }
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
}

extension HTTPClient.Configuration.ConnectionPool {
    /// A pool that makes one connection attempt when a request needs one, and fails the requests
    /// waiting for it as soon as it fails.
    ///
    /// AsyncHTTPClient's default (`retryConnectionEstablishment`) retries a failed attempt in the
    /// background, with a backoff (100 ms × 1.25ⁿ, up to 60 s) that only a connection made resets,
    /// and keeps the requests waiting until their connect timeout. Through an outage every refused
    /// attempt lengthens the backoff; once the server is back, requests still wait for the backoff
    /// timer and fail at the connect timeout while the server answers others in milliseconds. Here
    /// a refused connection is an answer at once (503 with `Retry-After`), and the next request
    /// opens a new connection: the first request after an outage gets through. Whether a failed
    /// request is sent again is Gatehouse's decision (`refreshRespectingPolicy`), never the pool's.
    static func outageSafe(idleTimeout: TimeAmount, connectionsPerHost: Int) -> Self {
        var pool = Self(idleTimeout: idleTimeout, concurrentHTTP1ConnectionsPerHostSoftLimit: connectionsPerHost)
        pool.retryConnectionEstablishment = false
        return pool
    }
}
