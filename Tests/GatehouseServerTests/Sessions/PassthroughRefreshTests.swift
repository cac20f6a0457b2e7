import Foundation
import GatehouseCore
@testable import GatehouseServer
import GatehouseSessions
import GatehouseStore
import GatehouseUpstreams
import HTTPTypes
import NIOCore
import HummingbirdTesting
import Testing

/// Refreshes of passthrough apps (the app holds the upstream's tokens) against a scripted
/// single-use upstream; the end-to-end suite repeats them against a real one, and across instances.
struct PassthroughRefreshTests {
    static let rotated = Data(#"{"access_token":"upstream-at-2","token_type":"Bearer","expires_in":3600,"refresh_token":"upstream-rt-2"}"#.utf8)

    static func refresh(_ client: any TestClientProtocol, _ token: String = "upstream-rt", app: String = "com.example.app")
        async throws -> TestResponse
    {
        try await client.postToken(["grant_type": "refresh_token", "refresh_token": token, "client_id": app])
    }

    static func refreshCalls(_ test: TestGatehouse) -> Int { test.upstream.recordedCalls.filter { $0.hasPrefix("refresh:") }.count }

    @Test func fiftyConcurrentRefreshesOfOneTokenMakeOneUpstreamCallAndShareOnePair() async throws {
        try await TestGatehouse.withRouter { test, client in
            test.upstream.answer(with: .success(Self.rotated))
            let bodies = try await withThrowingTaskGroup(of: (Int, String).self) { group in
                for _ in 0..<50 {
                    group.addTask {
                        let response = try await Self.refresh(client)
                        return (Int(response.status.code), String(buffer: response.body))
                    }
                }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            #expect(bodies.allSatisfy { $0.0 == 200 })
            #expect(Set(bodies.map(\.1)).count == 1)
            #expect(Self.refreshCalls(test) == 1)
            // The store holds the answer sealed, never the tokens.
            let record = try #require(try await test.store.passthroughToken(hash: SecureToken.hash("upstream-rt")))
            #expect(record.rotated && !String(decoding: record.answerSealed ?? Data(), as: UTF8.self).contains("upstream-at-2"))
        }
    }

    @Test func aReplayWithinTheWindowGetsThePairAndAfterItIsInvalidGrant() async throws {
        try await TestGatehouse.withRouter(grace: .seconds(30)) { test, client in
            test.upstream.answer(with: .success(Self.rotated))
            let first = try await Self.refresh(client)
            test.clock.advance(seconds: 29)
            let replay = try await Self.refresh(client)
            #expect(replay.status == .ok && String(buffer: replay.body) == String(buffer: first.body))
            test.clock.advance(seconds: 2)
            let late = try await Self.refresh(client)
            #expect(late.status == .badRequest && json(late)["error"] as? String == "invalid_grant")
            #expect(Self.refreshCalls(test) == 1)
            // The successor works (and is bound to the same app).
            #expect(try await Self.refresh(client, "upstream-rt-2").status == .ok)
            #expect(Self.refreshCalls(test) == 2)
        }
    }

    @Test func anotherAppsRefreshTokenIsInvalidGrantAndItsRevocationHasNoEffect() async throws {
        try await TestGatehouse.withRouter { test, client in
            test.upstream.answer(with: .success(Self.rotated))
            #expect(try await Self.refresh(client).status == .ok)  // binds upstream-rt-2 to com.example.app
            let stolen = try await Self.refresh(client, "upstream-rt-2", app: "com.example.other")
            #expect(stolen.status == .badRequest && json(stolen)["error"] as? String == "invalid_grant")
            var headers = HTTPFields()
            headers[.contentType] = "application/x-www-form-urlencoded"
            let revoke = try await client.execute(uri: "/oauth/revoke", method: .post, headers: headers,
                                                  body: ByteBuffer(string: "token=upstream-rt-2&client_id=com.example.other"))
            #expect(revoke.status == .ok)
            #expect(!test.upstream.recordedCalls.contains { $0.hasPrefix("revoke:") })
            #expect(Self.refreshCalls(test) == 1)
            #expect(try await Self.refresh(client, "upstream-rt-2").status == .ok)
        }
    }

    /// A quick failure is retried as the policy allows; one that waited out a timeout never is.
    @Test(arguments: [
        (RefreshTokenPolicy.singleUse, OAuthError.upstreamUnavailable("reset").delivered(.unknown), 1),
        (.singleUse, .upstreamUnavailable("refused").delivered(.unspent), 3),
        (.reusable, .upstreamUnavailable("reset").delivered(.unknown), 3),
        (.reusable, .upstreamTimeout("slow").delivered(.unknown), 1),
        (.singleUse, .upstreamUnavailable("no connection in time").delivered(.unspent, timedOut: true), 1),
    ])
    func anUnknownOutcomeIsNotRetriedOnASingleUseToken(policy: RefreshTokenPolicy, failure: OAuthError, calls: Int) async throws {
        try await TestGatehouse.withRouter(policy: policy) { test, client in
            test.upstream.answer(with: .failure(failure))
            let failed = try await Self.refresh(client)
            #expect(failed.status == .serviceUnavailable && failed.headers[.retryAfter] != nil)
            #expect(json(failed)["error"] as? String == "temporarily_unavailable")
            #expect(Self.refreshCalls(test) == calls)
            // Nothing was recorded as spent: the next attempt asks again and succeeds.
            test.upstream.answer(with: .success(Self.rotated))
            #expect(try await Self.refresh(client).status == .ok)
        }
    }
}

/// A 60-second (or 10-second) upstream token with the default 60-second skew used to be due at
/// once after every refresh, so every request refreshed it.
struct RefreshScheduleTests {
    @Test func aFreshTokenIsNeverDueAtOnce() {
        let now = Date()
        for lifetime in [10.0, 60, 3600] {
            #expect(!RefreshSchedule.isDue(expiresAt: now.addingTimeInterval(lifetime), lifetime: lifetime, skew: .seconds(60), now: now))
            #expect(RefreshSchedule.isDue(expiresAt: now.addingTimeInterval(lifetime), lifetime: lifetime, skew: .seconds(60),
                                          now: now.addingTimeInterval(lifetime - min(60, lifetime / 2))))
        }
        #expect(RefreshSchedule.effectiveSkew(configured: .seconds(60), lifetime: 60) == 30)
        #expect(RefreshSchedule.effectiveSkew(configured: .seconds(60), lifetime: 3600) == 60)
        #expect(RefreshSchedule.effectiveSkew(configured: .seconds(60), lifetime: nil) == 60)
    }

    @Test(arguments: [60, 10])
    func aSealedSessionRefreshesOncePerHalfLifetimeUnderSteadyUse(lifetime: Int) async throws {
        try await TestGatehouse.withRouter { test, client in
            test.upstream.answer(with: .success(Data(#"{"access_token":"at","token_type":"Bearer","expires_in":\#(lifetime),"refresh_token":"rt"}"#.utf8)))
            let pair = try await SealedSessionTests.signIn(client)
            let access = try #require(pair["access_token"] as? String)
            let sessions = try #require(test.gatehouse.sessions)
            // Use the session every second of (virtual) time while its Gatehouse access token lives (5 minutes).
            let seconds = 290
            for _ in 0..<seconds {
                guard case .fresh = await sessions.upstreamAccessToken(forGatehouseToken: access, upstreams: test.gatehouse.upstreams) else {
                    Issue.record("the session did not answer")
                    return
                }
                test.clock.advance(seconds: 1)
            }
            // Each token is refreshed once, at half its lifetime; before the fix, a token no longer
            // than the skew was refreshed on every call (290 refreshes here).
            let refreshes = test.upstream.recordedCalls.filter { $0.hasPrefix("refresh:") }.count
            let expected = seconds / (lifetime / 2)
            #expect(refreshes <= expected + 1)
            #expect(refreshes >= expected - 1)
        }
    }
}
