public import AsyncHTTPClient
public import CoreMetrics
import Foundation
public import GatehouseCore
public import Logging
public import NIOCore
public import NIOHTTP1
import NIOSSL

/// Gatehouse's exchanges with one upstream, whatever its kind: token requests with its client
/// credentials, revocations, and plain reads (discovery, JWKS, userinfo), each bounded by the
/// upstream's `timeout`, body included, and each counted, timed and traced (`UpstreamTelemetry`).
///
/// After the token endpoint answers 429, no code exchange or refresh is sent until the wait it
/// asked for is over (`UpstreamBackoff`): the app is answered 503 with `Retry-After` at once.
/// A 429 answered to a request made for a token Gatehouse has no record of (`Trust.unknownToken`,
/// a task-local the caller sets) backs off only such requests: one client's made-up tokens never
/// put every user into a backoff. Everyone else's 429 is obeyed by those requests too.
public struct UpstreamHTTP: Sendable {
    public let settings: UpstreamSettings
    public let logger: Logger
    let transport: Transport
    let telemetry: UpstreamTelemetry
    let backoff: UpstreamBackoff
    let unknownTokenBackoff: UpstreamBackoff
    /// `ca_file` and the mutual-TLS client certificate, on every connection to the upstream; a
    /// failure when they cannot be used (fail closed: never the system's roots, never no certificate).
    let tls: Result<TLSConfiguration?, OAuthError>

    /// Whom a token request is made for.
    public enum Trust: Sendable {
        /// A sign-in, or a token Gatehouse handed out or saw refreshed.
        case known
        /// A refresh token Gatehouse has no record of: maybe made up.
        case unknownToken
    }

    /// The trust of the token requests made in this task (`.known` unless the caller says).
    @TaskLocal public static var trust: Trust = .known

    /// One request and the whole answer (at most `maximumResponseBytes`), within the timeout.
    typealias Transport = @Sendable (HTTPClientRequest, Duration) async throws -> (HTTPResponseStatus, HTTPHeaders, ByteBuffer)

    /// Largest answer read from an upstream.
    static let maximumResponseBytes = 256 * 1024

    public init(settings: UpstreamSettings, httpClient: HTTPClient, logger: Logger) {
        self.init(settings: settings, transport: Self.transport(over: httpClient), logger: logger)
    }

    /// - Parameters:
    ///   - metrics: `nil` counts in the process's metrics; tests hand in their own factory.
    ///   - now: the clock of the 429 backoff.
    init(settings: UpstreamSettings, transport: @escaping Transport, logger: Logger, metrics: (any MetricsFactory)? = nil,
         now: @escaping @Sendable () -> ContinuousClock.Instant = { .now }) {
        self.settings = settings
        do {
            tls = .success(try settings.tlsConfiguration())
        } catch {
            // The configuration loader built the same settings already: not reached.
            logger.error("upstream TLS settings unusable", metadata: ["upstream": .string(settings.name)])
            tls = .failure(OAuthError.badUpstream("Gatehouse's TLS settings toward the authorization server cannot be used").delivered(.notUpstream))
        }
        if let certificate = settings.clientCertificate {
            Self.warnOfValidity(certificate, upstream: settings.name, logger: logger)
        }
        self.transport = transport
        self.logger = logger
        self.telemetry = UpstreamTelemetry(upstream: settings.name, metrics: metrics)
        self.backoff = UpstreamBackoff(now: now)
        self.unknownTokenBackoff = UpstreamBackoff(now: now)
    }

    /// A token-endpoint request (code, refresh) and its checked answer.
    func tokenRequest(url: String, _ parameters: [(String, String)], endpoint: UpstreamEndpoint, purpose: String)
        async throws(OAuthError) -> UpstreamTokenResponse
    {
        let lane = Self.trust == .unknownToken ? unknownTokenBackoff : backoff
        if let seconds = backoff.remainingSeconds() ?? lane.remainingSeconds() {
            // Nothing is sent: a refusal by Gatehouse, which no retry loop should repeat.
            telemetry.rateLimited(.upstream_backoff)
            throw .upstreamUnavailable("the authorization server asked Gatehouse to slow down; retry after \(seconds) s", retryAfter: seconds)
        }
        let request = try settings.authenticatedForm(url: url, parameters, tokenEndpoint: url)
        let (status, headers, data) = try await sendWithHeaders(request, endpoint: endpoint, purpose: purpose)
        if status == 429 {
            let seconds = lane.start(retryAfter: headers.first(name: "Retry-After"))
            logger.warning("upstream \(purpose) rate limited; backing off", metadata: [
                "upstream": .string(settings.name), "retry_after": .stringConvertible(seconds),
            ])
            // RFC 6585 §4: the upstream did not act on the request.
            throw OAuthError.upstreamUnavailable("the authorization server is temporarily unavailable (HTTP 429)", retryAfter: seconds)
                .delivered(.unspent)
        }
        do throws(OAuthError) {
            return try UpstreamFailure.interpret(status: status, body: data)
        } catch {
            logger.warning("upstream \(purpose) refused", metadata: [
                "upstream": .string(settings.name), "status": .stringConvertible(status), "error": .string(error.code),
            ])
            throw error
        }
    }

    /// The authorization-code grant (RFC 6749 §4.1.3), with the PKCE verifier the sign-in's memo calls for.
    func exchangeCode(url: String, code: String, redirectURI: String, memo: UpstreamMemo, appCodeVerifier: String?)
        async throws(OAuthError) -> UpstreamTokenResponse
    {
        var form = [("grant_type", "authorization_code"), ("code", code), ("redirect_uri", redirectURI)]
        if let verifier = memo.forwardsAppVerifier ? appCodeVerifier : memo.codeVerifier { form.append(("code_verifier", verifier)) }
        return try await tokenRequest(url: url, form, endpoint: .token, purpose: "code exchange")
    }

    /// The refresh-token grant (RFC 6749 §6).
    func refresh(url: String, refreshToken: String, scope: String?) async throws(OAuthError) -> UpstreamTokenResponse {
        var form = [("grant_type", "refresh_token"), ("refresh_token", refreshToken)]
        if let scope { form.append(("scope", scope)) }
        return try await tokenRequest(url: url, form, endpoint: .refresh, purpose: "refresh")
    }

    /// RFC 7009 revocation, best effort: failures are logged, never thrown. `tokenEndpoint`: the
    /// upstream's token endpoint, which a client assertion posted here never names.
    func revoke(url: String, token: String, hint: String, tokenEndpoint: String) async {
        do {
            let request = try settings.authenticatedForm(url: url, [("token", token), ("token_type_hint", hint)], tokenEndpoint: tokenEndpoint)
            let (status, _, _) = try await exchange(request, endpoint: .revoke)
            if status != .ok {
                logger.warning("upstream revocation refused", metadata: ["upstream": .string(settings.name), "status": .stringConvertible(status.code)])
            }
        } catch {
            logger.warning("upstream revocation failed", metadata: ["upstream": .string(settings.name)])
        }
    }

    /// A GET (with a bearer token when given): status, content type and body. Transport
    /// failures are thrown as the app should see them.
    func get(_ url: String, bearer: String? = nil, accept: String = "application/json", endpoint: UpstreamEndpoint, purpose: String)
        async throws(OAuthError) -> (status: Int, contentType: String?, body: Data)
    {
        var request = HTTPClientRequest(url: url)
        request.headers.add(name: "Accept", value: accept)
        if let bearer { request.headers.add(name: "Authorization", value: "Bearer " + bearer) }
        let (status, headers, body) = try await sendWithHeaders(request, endpoint: endpoint, purpose: purpose)
        return (status, headers.first(name: "Content-Type"), body)
    }

    /// A request and its status, headers and body, transport failures mapped for the app.
    func sendWithHeaders(_ request: HTTPClientRequest, endpoint: UpstreamEndpoint, purpose: String)
        async throws(OAuthError) -> (status: Int, headers: HTTPHeaders, body: Data)
    {
        do {
            let (status, headers, bytes) = try await exchange(request, endpoint: endpoint)
            return (Int(status.code), headers, Data(bytes.readableBytesView))
        } catch {
            let mapped = UpstreamFailure.classify(error, upstream: settings.name)
            logger.warning("upstream \(purpose) failed", metadata: [
                "upstream": .string(settings.name), "error": .string(mapped.code),
                "reason": .string(UpstreamFailure.logDetail(error, mapped: mapped)),
            ])
            throw mapped
        }
    }

    /// One request to the upstream and its whole answer, counted and traced as `endpoint`.
    func exchange(_ request: HTTPClientRequest, endpoint: UpstreamEndpoint) async throws -> (HTTPResponseStatus, HTTPHeaders, ByteBuffer) {
        let (transport, timeout) = (self.transport, settings.timeout)
        var request = request
        if let tls = try tls.get() { request.tlsConfiguration = tls }
        return try await telemetry.call(endpoint, request, classify: { (answer: (HTTPResponseStatus, HTTPHeaders, ByteBuffer)) in
            let status = Int(answer.0.code)
            // Only a token endpoint's 400 is read again, for invalid_grant.
            let body = status == 400 && endpoint.isTokenEndpoint ? Data(answer.2.readableBytesView) : nil
            return (GatehouseMetrics.Outcome(status: status, body: body), status)
        }, send: { request in
            try await transport(request, timeout)
        })
    }

    /// A client certificate the upstream will refuse, said at start: not yet valid, expired, or
    /// expiring within 14 days.
    static func warnOfValidity(_ certificate: ClientCertificate, upstream: String, logger: Logger, now: Date = Date()) {
        let state = certificate.notValidBefore > now ? "is not valid yet"
            : certificate.notValidAfter <= now ? "has expired"
            : certificate.notValidAfter.timeIntervalSince(now) < 14 * 86400 ? "expires within 14 days" : nil
        guard let state else { return }
        logger.warning("upstream client certificate \(state)", metadata: [
            "upstream": .string(upstream), "not_valid_after": .string(ISO8601DateFormatter().string(from: certificate.notValidAfter)),
        ])
    }

    /// The `JWKSCache` fetch of this upstream's key set: `GET url` accepting JSON, counted as `jwks`.
    func keySetFetcher() -> JWKSCache.Fetch {
        { [self] url in
            var request = HTTPClientRequest(url: url)
            request.headers.add(name: "Accept", value: "application/json")
            let (status, _, body) = try await exchange(request, endpoint: .jwks)
            return (Int(status.code), Data(body.readableBytesView))
        }
    }

    /// AsyncHTTPClient, within the upstream's `timeout` (its own deadline stops at the response head).
    static func transport(over httpClient: HTTPClient) -> Transport {
        { request, timeout in
            try await withDeadline(timeout, orThrow: { HTTPClientError.deadlineExceeded }) {
                let response = try await httpClient.execute(request, timeout: .nanoseconds(timeout.inNanoseconds))
                return (response.status, response.headers, try await response.body.collect(upTo: Self.maximumResponseBytes))
            }
        }
    }
}
