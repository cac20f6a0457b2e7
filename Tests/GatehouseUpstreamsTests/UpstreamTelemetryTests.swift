import AsyncHTTPClient
import Foundation
import GatehouseCore
@testable import GatehouseUpstreams
import Logging
import MetricsTestKit
import NIOCore
import NIOHTTP1
import Synchronization
import Testing

/// An upstream that answers from a script, counting what it was sent: no socket, no server.
final class ScriptedUpstream: Sendable {
    enum Answer: Sendable {
        case status(Int, headers: [(String, String)] = [], body: String = "")
        case failure(HTTPClientError)
        /// The connection refused, as the pool reports it at once: nothing sent.
        case refused
    }

    private let script: Mutex<[Answer]>
    private let received = Mutex<[HTTPClientRequest]>([])

    init(_ answers: [Answer]) {
        self.script = Mutex(answers)
    }

    /// Requests that reached the upstream.
    var requests: [HTTPClientRequest] { received.withLock { $0 } }
    var calls: Int { requests.count }

    func then(_ answers: Answer...) {
        script.withLock { $0 += answers }
    }

    var transport: UpstreamHTTP.Transport {
        { request, _ in
            self.received.withLock { $0.append(request) }
            let answer = self.script.withLock { $0.isEmpty ? Answer.status(500) : $0.removeFirst() }
            switch answer {
            case .status(let code, let headers, let body):
                return (HTTPResponseStatus(statusCode: code), HTTPHeaders(headers), ByteBuffer(string: body))
            case .failure(let error):
                throw error
            case .refused:
                throw IOError(errnoCode: ECONNREFUSED, reason: "connect")
            }
        }
    }
}

/// A monotonic clock the test moves by hand.
final class ManualClock: Sendable {
    private let instant = Mutex(ContinuousClock.now)
    var now: ContinuousClock.Instant { instant.withLock { $0 } }
    func advance(_ duration: Duration) { instant.withLock { $0 += duration } }
}

/// Upstream calls are counted and timed by endpoint and outcome; a 429 from the token endpoint
/// stops code exchanges and refreshes for the wait it names, without a request (spec §3, §6).
struct UpstreamTelemetryTests {
    static let tokens = #"{"access_token":"at","token_type":"Bearer","refresh_token":"rt","expires_in":60}"#

    struct Fixture {
        let upstream: ScriptedUpstream
        let clock = ManualClock()
        let metrics = TestMetrics()
        let profile: OAuth2Upstream

        init(_ answers: [ScriptedUpstream.Answer], policy: RefreshTokenPolicy = .singleUse) {
            let upstream = ScriptedUpstream(answers)
            self.upstream = upstream
            var settings = UpstreamSettings(
                name: "op", kind: "oauth2", clientID: "c", clientSecret: Secret("s"),
                profile: OAuth2Settings(authorizationEndpoint: "https://op.example/authorize", tokenEndpoint: "https://op.example/token"))
            settings.refreshTokenPolicy = policy
            let clock = self.clock
            profile = OAuth2Upstream(http: UpstreamHTTP(settings: settings, transport: upstream.transport, logger: Logger(label: "test"),
                                                        metrics: metrics, now: { clock.now }))
        }

        func refresh() async -> Result<UpstreamTokenResponse, OAuthError> {
            do throws(OAuthError) {
                return .success(try await profile.refresh("rt", scope: nil))
            } catch {
                return .failure(error)
            }
        }

        func exchangeCode() async -> Result<UpstreamGrant, OAuthError> {
            do throws(OAuthError) {
                return .success(try await profile.completeAuthorization(code: "code", redirectURI: "https://app.example/cb",
                                                                         memo: UpstreamMemo(), appCodeVerifier: nil))
            } catch {
                return .failure(error)
            }
        }

        func counted(_ endpoint: String, _ outcome: String) -> Int64 {
            metrics.counterTotal(label: GatehouseMetrics.upstreamRequestsTotal,
                                 dimensions: [("upstream", "op"), ("endpoint", endpoint), ("outcome", outcome)])
        }

        var backoffRefusals: Int64 {
            metrics.counterTotal(label: GatehouseMetrics.rateLimitedTotal, dimensions: [("limit", "upstream_backoff")])
        }
    }

    // MARK: 429 backoff

    @Test func anUpstream429StopsTokenCallsUntilItsRetryAfterIsOver() async throws {
        let fixture = Fixture([.status(429, headers: [("Retry-After", "30")])])

        let first = try #require(await fixture.refresh().failure)
        #expect(first.status == 503 && first.code == "temporarily_unavailable")
        #expect(first.retryAfter == 30)
        #expect(fixture.upstream.calls == 1)

        // Refreshes and code exchanges alike are refused at once, nothing sent.
        fixture.clock.advance(.seconds(10))
        let second = try #require(await fixture.refresh().failure)
        #expect(second.status == 503 && second.retryAfter == 20)
        let exchange = try #require(await fixture.exchangeCode().failure)
        #expect(exchange.status == 503 && exchange.retryAfter == 20)
        #expect(fixture.upstream.calls == 1)
        #expect(fixture.backoffRefusals == 2)
        #expect(fixture.counted("refresh", "4xx") == 1)

        fixture.clock.advance(.seconds(20))
        fixture.upstream.then(.status(200, body: Self.tokens))
        let tokens = try await fixture.refresh().get()
        #expect(tokens.accessToken.reveal() == "at")
        #expect(fixture.upstream.calls == 2)
    }

    @Test func a429ToARefreshOfAnUnknownTokenBacksOffOnlySuchRefreshes() async throws {
        let fixture = Fixture([.status(429, headers: [("Retry-After", "60")]), .status(200, body: Self.tokens)])
        let junk = await UpstreamHTTP.$trust.withValue(.unknownToken) { await fixture.refresh() }
        #expect(junk.failure?.status == 503 && junk.failure?.retryAfter == 60)
        // Everyone else is not held back by it: the next (known) refresh is sent, and succeeds.
        #expect(await fixture.refresh().success != nil)
        #expect(fixture.upstream.calls == 2)
        // Another unknown token meets the backoff its lane started, nothing sent.
        let again = await UpstreamHTTP.$trust.withValue(.unknownToken) { await fixture.refresh() }
        #expect(again.failure?.retryAfter == 60)
        #expect(fixture.upstream.calls == 2)
        #expect(fixture.backoffRefusals == 1)
    }

    @Test func aBackoffEveryoneMustObeyHoldsUnknownTokensToo() async throws {
        let fixture = Fixture([.status(429, headers: [("Retry-After", "30")])])
        #expect(await fixture.refresh().failure?.retryAfter == 30)
        let junk = await UpstreamHTTP.$trust.withValue(.unknownToken) { await fixture.refresh() }
        #expect(junk.failure?.retryAfter == 30)
        #expect(fixture.upstream.calls == 1)
    }

    @Test func a429WithoutRetryAfterWaitsFiveSeconds() async throws {
        let fixture = Fixture([.status(429), .status(200, body: Self.tokens)])
        #expect(await fixture.exchangeCode().failure?.retryAfter == 5)
        fixture.clock.advance(.milliseconds(4500))
        #expect(await fixture.refresh().failure?.retryAfter == 1)
        fixture.clock.advance(.milliseconds(500))
        #expect(await fixture.refresh().success != nil)
        #expect(fixture.upstream.calls == 2)
    }

    @Test func aRetriedRefreshIsNotSentDuringTheBackoff() async throws {
        let fixture = Fixture([.status(429, headers: [("Retry-After", "60")])])
        do throws(OAuthError) {
            _ = try await fixture.profile.refreshRespectingPolicy("rt", scope: nil)
            Issue.record("a refresh answered 429 succeeded")
        } catch {
            #expect(error.status == 503)
            #expect(error.retryAfter == 60)
        }
        // The 429 is retryable (the upstream did not act), but the retry meets the backoff.
        #expect(fixture.upstream.calls == 1)
        #expect(fixture.backoffRefusals == 1)
    }

    // MARK: Retries of a refresh

    @Test func aRefusedConnectionIsRetriedNothingHavingBeenSent() async throws {
        let fixture = Fixture([.refused, .refused, .status(200, body: Self.tokens)])
        let tokens = try await fixture.profile.refreshRespectingPolicy("rt", scope: nil)
        #expect(tokens.accessToken.reveal() == "at")
        #expect(fixture.upstream.calls == 3)
    }

    /// An attempt that waited out a timeout is the last, whatever the policy: a second one would
    /// make the app wait as long again (three connect timeouts in a row during an outage).
    @Test(arguments: [HTTPClientError.connectTimeout, .getConnectionFromPoolTimeout, .deadlineExceeded, .readTimeout],
          [RefreshTokenPolicy.singleUse, .reusable])
    func anAttemptThatWaitedOutATimeoutIsNotRepeated(timeout: HTTPClientError, policy: RefreshTokenPolicy) async throws {
        let fixture = Fixture([.failure(timeout), .status(200, body: Self.tokens)], policy: policy)
        do throws(OAuthError) {
            _ = try await fixture.profile.refreshRespectingPolicy("rt", scope: nil)
            Issue.record("a refresh that timed out succeeded")
        } catch {
            #expect(error.timedOut)
            #expect(error.status == 503 || error.status == 504)
        }
        #expect(fixture.upstream.calls == 1)
    }

    @Test func aResetAfterSendingIsRetriedOnlyForReusableTokens() async throws {
        for (policy, calls) in [(RefreshTokenPolicy.singleUse, 1), (.reusable, 2)] {
            let fixture = Fixture([.failure(.remoteConnectionClosed), .status(200, body: Self.tokens)], policy: policy)
            _ = try? await fixture.profile.refreshRespectingPolicy("rt", scope: nil)
            #expect(fixture.upstream.calls == calls, "\(policy)")
        }
    }

    @Test func revocationIsNotHeldBackByTheTokenEndpointsBackoff() async throws {
        var settings = UpstreamSettings(
            name: "op", kind: "oauth2", clientID: "c", clientSecret: Secret("s"),
            profile: OAuth2Settings(authorizationEndpoint: "https://op.example/authorize", tokenEndpoint: "https://op.example/token",
                                    revocationEndpoint: "https://op.example/revoke"))
        settings.timeout = .seconds(1)
        let upstream = ScriptedUpstream([.status(429, headers: [("Retry-After", "60")]), .status(200)])
        let profile = OAuth2Upstream(http: UpstreamHTTP(settings: settings, transport: upstream.transport, logger: Logger(label: "test")))
        do throws(OAuthError) {
            _ = try await profile.refresh("rt", scope: nil)
        } catch {
            #expect(error.retryAfter == 60)
        }
        await profile.revoke("rt", hint: "refresh_token")
        #expect(upstream.calls == 2)
    }

    // MARK: Retry-After

    static let now = Date(timeIntervalSince1970: 1_700_000_000)  // Tue, 14 Nov 2023 22:13:20 GMT

    @Test(arguments: [
        ("120", 120), ("0", 1), ("1", 1), ("300", 300), ("301", 300), ("99999999999999999999999", 300),
        ("Tue, 14 Nov 2023 22:14:05 GMT", 45), ("Tuesday, 14-Nov-23 22:14:05 GMT", 45), ("Tue Nov 14 22:14:05 2023", 45),
        ("Tue, 14 Nov 2023 21:00:00 GMT", 1), ("Wed, 15 Nov 2023 22:13:20 GMT", 300),
        ("", 5), ("soon", 5), ("-5", 5), ("1.5", 5), ("30 seconds", 5),
    ])
    func retryAfterIsReadAsSecondsOrAnHTTPDate(header: String, seconds: Int) {
        #expect(UpstreamBackoff.wait(retryAfter: header, now: Self.now) == .seconds(seconds))
    }

    @Test func anAbsentRetryAfterIsTheDefault() {
        #expect(UpstreamBackoff.wait(retryAfter: nil, now: Self.now) == UpstreamBackoff.defaultWait)
    }

    @Test func aLongerBackoffUnderWayIsKept() {
        let clock = ManualClock()
        let backoff = UpstreamBackoff(now: { clock.now })
        #expect(backoff.remainingSeconds() == nil)
        #expect(backoff.start(retryAfter: "100") == 100)
        #expect(backoff.start(retryAfter: "10") == 10)
        #expect(backoff.remainingSeconds() == 100)
        clock.advance(.milliseconds(99_001))
        #expect(backoff.remainingSeconds() == 1)
        clock.advance(.seconds(1))
        #expect(backoff.remainingSeconds() == nil)
    }

    // MARK: Outcomes

    @Test func everyCallIsCountedAndTimedByOutcome() async throws {
        let fixture = Fixture([
            .status(200, body: Self.tokens),
            .status(400, body: #"{"error":"invalid_grant"}"#),
            .status(400, body: #"{"error":"invalid_request"}"#),
            .status(401, body: #"{"error":"invalid_client"}"#),
            .status(500),
            .status(502),
            .failure(.deadlineExceeded),
            .failure(.readTimeout),
            .failure(.connectTimeout),
            .failure(.remoteConnectionClosed),
        ])
        for _ in 0..<10 { _ = await fixture.refresh() }
        #expect(fixture.counted("refresh", "ok") == 1)
        #expect(fixture.counted("refresh", "invalid_grant") == 1)
        #expect(fixture.counted("refresh", "4xx") == 2)
        #expect(fixture.counted("refresh", "5xx") == 2)
        #expect(fixture.counted("refresh", "timeout") == 2)
        #expect(fixture.counted("refresh", "unreachable") == 2)
        let timer = try fixture.metrics.expectTimer(GatehouseMetrics.upstreamRequestDuration, [("upstream", "op"), ("endpoint", "refresh")])
        #expect(timer.values.count == 10)
        #expect(fixture.metrics.counterTotal(label: GatehouseMetrics.rateLimitedTotal) == 0)
    }

    @Test func aCodeExchangeIsTheTokenEndpoint() async throws {
        let fixture = Fixture([.status(400, body: #"{"error":"invalid_grant","error_description":"code used"}"#)])
        #expect(await fixture.exchangeCode().failure?.code == "invalid_grant")
        #expect(fixture.counted("token", "invalid_grant") == 1)
    }

    @Test(arguments: [(200, "ok"), (204, "ok"), (302, "ok"), (400, "4xx"), (404, "4xx"), (429, "4xx"), (500, "5xx"), (503, "5xx")])
    func answersAreClassifiedByStatus(status: Int, outcome: String) {
        #expect(GatehouseMetrics.Outcome(status: status).rawValue == outcome)
    }

    @Test func onlyA400CarryingInvalidGrantIsInvalidGrant() {
        let invalidGrant = Data(#"{"error":"invalid_grant"}"#.utf8)
        #expect(GatehouseMetrics.Outcome(status: 400, body: invalidGrant) == .invalid_grant)
        #expect(GatehouseMetrics.Outcome(status: 401, body: invalidGrant) == .clientError)
        #expect(GatehouseMetrics.Outcome(status: 400, body: Data("not json".utf8)) == .clientError)
        #expect(GatehouseMetrics.Outcome(status: 400, body: nil) == .clientError)
    }

    @Test func transportFailuresAreTimeoutsOrUnreachable() {
        #expect(GatehouseMetrics.Outcome(transportError: HTTPClientError.deadlineExceeded) == .timeout)
        #expect(GatehouseMetrics.Outcome(transportError: HTTPClientError.readTimeout) == .timeout)
        #expect(GatehouseMetrics.Outcome(transportError: HTTPClientError.connectTimeout) == .unreachable)
        #expect(GatehouseMetrics.Outcome(transportError: HTTPClientError.remoteConnectionClosed) == .unreachable)
        #expect(GatehouseMetrics.Outcome(transportError: CancellationError()) == .unreachable)
    }

    // MARK: Tracing

    @Test func theInjectorReplacesATraceparent() {
        var headers = HTTPHeaders([("traceparent", "00-old-old-01"), ("Accept", "application/json")])
        HTTPHeadersInjector().inject("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", forKey: "traceparent", into: &headers)
        #expect(headers["traceparent"] == ["00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"])
        #expect(headers["Accept"] == ["application/json"])
    }

    @Test func aCallHandsItsErrorBackUnchangedAndCountsIt() async throws {
        let metrics = TestMetrics()
        let telemetry = UpstreamTelemetry(upstream: "apple", metrics: metrics)
        let request = HTTPClientRequest(url: "https://appleid.apple.com/auth/keys")
        await #expect(throws: HTTPClientError.connectTimeout) {
            try await telemetry.call(.jwks, request, classify: { (status: Int) in (GatehouseMetrics.Outcome(status: status), status) },
                                     send: { _ in throw HTTPClientError.connectTimeout })
        }
        let status = try await telemetry.call(.jwks, request, classify: { (status: Int) in (GatehouseMetrics.Outcome(status: status), status) },
                                              send: { _ in 200 })
        #expect(status == 200)
        for (outcome, count) in [("unreachable", 1), ("ok", 1)] as [(String, Int64)] {
            #expect(metrics.counterTotal(label: GatehouseMetrics.upstreamRequestsTotal,
                                         dimensions: [("upstream", "apple"), ("endpoint", "jwks"), ("outcome", outcome)]) == count)
        }
    }
}

extension Result {
    var failure: Failure? {
        if case .failure(let error) = self { return error }
        return nil
    }

    var success: Success? {
        if case .success(let value) = self { return value }
        return nil
    }
}
