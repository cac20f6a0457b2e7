import Foundation
import GatehouseCore
@testable import GatehouseSessions
import GatehouseStore
import GatehouseUpstreams
import Testing

/// The passthrough refresher on its own (a real store, a scripted upstream): concurrent refreshes
/// of one token make one upstream call, in one instance and across two; within the grace window
/// the answer is replayed; and what each kind of upstream failure leaves behind.
struct PassthroughRefresherTests {
    typealias Fixture = RefresherFixture

    static func refresh(_ refresher: PassthroughRefresher, _ fixture: Fixture, _ token: String = "upstream-rt", client: AppClient = Fixture.app,
                        admitUnknown: @escaping @Sendable () throws(OAuthError) -> Void = {}) async -> Result<Data, OAuthError> {
        do throws(OAuthError) {
            return .success(try await refresher.refresh(token, scope: nil, client: client, upstream: fixture.upstream, admitUnknown: admitUnknown))
        } catch {
            return .failure(error)
        }
    }

    static func answer(_ result: Result<Data, OAuthError>) -> Data? {
        try? result.get()
    }

    static func error(_ result: Result<Data, OAuthError>) -> OAuthError? {
        if case .failure(let error) = result { return error }
        return nil
    }

    // MARK: Coalescing

    @Test func concurrentRefreshesOfOneTokenMakeOneUpstreamCallAndShareOnePair() async throws {
        let gate = Gate()
        try await Fixture.with(ScriptedUpstream(gate: gate)) { fixture, refresher in
            let arrivals = Arrivals()
            let results = await withTaskGroup(of: Result<Data, OAuthError>?.self) { group in
                for _ in 0..<20 {
                    group.addTask {
                        arrivals.arrive()
                        return await Self.refresh(refresher, fixture)
                    }
                }
                group.addTask {
                    // The upstream holds the first refresh until every caller has asked.
                    await fixture.upstream.called.reached(1)
                    await arrivals.reached(20)
                    gate.open()
                    return nil
                }
                return await group.reduce(into: [Result<Data, OAuthError>]()) { if let result = $1 { $0.append(result) } }
            }
            #expect(fixture.upstream.refreshes == ["upstream-rt"])
            #expect(results.count == 20 && results.allSatisfy { Self.answer($0) == ScriptedUpstream.rotated })
        }
    }

    @Test func twoInstancesOnOneStoreMakeOneUpstreamCall() async throws {
        let gate = Gate()
        try await Fixture.with(ScriptedUpstream(gate: gate)) { fixture, first in
            let reads = Arrivals()
            let second = fixture.refresher(store: CountingStore(base: fixture.store, reads: reads))
            async let firstResult = Self.refresh(first, fixture)
            // The first instance holds the lease and is asking the upstream...
            await fixture.upstream.called.reached(1)
            async let secondResult = Self.refresh(second, fixture)
            // ...when the second reads the token's record: it waits for the first's answer.
            await reads.reached(1)
            gate.open()
            let (one, two) = await (firstResult, secondResult)
            #expect(Self.answer(one) == ScriptedUpstream.rotated)
            #expect(Self.answer(two) == ScriptedUpstream.rotated)
            #expect(fixture.upstream.refreshes.count == 1)
        }
    }

    @Test func withinTheGraceWindowTheAnswerIsReplayedAndAfterItTheSpentTokenIsRefused() async throws {
        try await Fixture.with(grace: .seconds(30)) { fixture, refresher in
            let answer = try await Self.refresh(refresher, fixture).get()
            // Well inside the window: the clock keeps running, and a loaded machine may take seconds between two steps.
            fixture.clock.advance(seconds: 20)
            #expect(Self.answer(await Self.refresh(refresher, fixture)) == answer)
            // The same from another instance: the answer is in the store, sealed.
            #expect(Self.answer(await Self.refresh(fixture.refresher(), fixture)) == answer)
            fixture.clock.advance(seconds: 11)
            let late = Self.error(await Self.refresh(refresher, fixture))
            #expect(late?.code == "invalid_grant")
            #expect(fixture.upstream.refreshes == ["upstream-rt"])
            // A replaced token presented after the window is a security event, audited.
            #expect(fixture.audit.entries.contains { $0.metadata.contains("reuse_detected") })
            // The successor pair was bound to the app before anyone could see it.
            let owners = (try await refresher.owner(of: "upstream-rt-2"), try await refresher.owner(of: "upstream-at-2"))
            #expect(owners.0 == Fixture.app.clientID && owners.1 == Fixture.app.clientID)
        }
    }

    @Test func theStoreKeepsTheAnswerSealedNeverTheTokens() async throws {
        try await Fixture.with { fixture, refresher in
            _ = try await Self.refresh(refresher, fixture).get()
            let record = try #require(try await fixture.store.passthroughToken(hash: SecureToken.hash("upstream-rt")))
            let sealed = try #require(record.answerSealed)
            #expect(record.rotated)
            #expect(sealed.range(of: Data("upstream-at-2".utf8)) == nil && sealed.range(of: Data("upstream-rt-2".utf8)) == nil)
        }
    }

    // MARK: Upstream failures

    @Test func aFailureReachesEveryConcurrentCaller() async throws {
        let gate = Gate()
        let upstream = ScriptedUpstream(answer: .failure(.upstreamUnavailable("the upstream is down", retryAfter: 9).delivered(.unspent)),
                                        gate: gate)
        try await Fixture.with(upstream) { fixture, refresher in
            let arrivals = Arrivals()
            // On one serial executor each caller arrives and reaches the coalescer in one step:
            // when the gate opens, all five are waiting on the one call.
            let errors = await withTaskExecutorPreference(SerialTaskExecutor()) {
                await withTaskGroup(of: OAuthError?.self) { group in
                    for _ in 0..<5 {
                        group.addTask {
                            arrivals.arrive()
                            return Self.error(await Self.refresh(refresher, fixture))
                        }
                    }
                    group.addTask {
                        await fixture.upstream.called.reached(1)
                        await arrivals.reached(5)
                        gate.open()
                        return nil
                    }
                    return await group.reduce(into: [OAuthError]()) { if let error = $1 { $0.append(error) } }
                }
            }
            #expect(fixture.upstream.refreshes.count == 1)
            #expect(errors.count == 5)
            #expect(errors.allSatisfy { $0.code == "temporarily_unavailable" && $0.detail == "the upstream is down" && $0.retryAfter == 9 })
        }
    }

    @Test func anInvalidGrantIsPassedOnAndTheTokenIsNeverSentAgain() async throws {
        let upstream = ScriptedUpstream(answer: .failure(.invalidGrant("the refresh token was revoked")))
        try await Fixture.with(upstream) { fixture, refresher in
            #expect(Self.error(await Self.refresh(refresher, fixture))?.code == "invalid_grant")
            fixture.upstream.answer(with: .success(ScriptedUpstream.rotated))
            #expect(Self.error(await Self.refresh(refresher, fixture))?.code == "invalid_grant")
            #expect(Self.error(await Self.refresh(fixture.refresher(), fixture))?.code == "invalid_grant")
            #expect(fixture.upstream.refreshes == ["upstream-rt"])
        }
    }

    @Test func anUnspentFailureCarriesTheUpstreamsWaitAndTheNextAttemptAsksAgain() async throws {
        let upstream = ScriptedUpstream(answer: .failure(.upstreamUnavailable("slow down", retryAfter: 17).delivered(.unspent)))
        try await Fixture.with(upstream) { fixture, refresher in
            let failure = try #require(Self.error(await Self.refresh(refresher, fixture)))
            #expect(failure.code == "temporarily_unavailable" && failure.retryAfter == 17)
            // The lease was given back, nothing recorded as spent: the next attempt reaches the upstream.
            fixture.upstream.answer(with: .success(ScriptedUpstream.rotated))
            #expect(Self.answer(await Self.refresh(refresher, fixture)) == ScriptedUpstream.rotated)
            #expect(fixture.upstream.refreshes == ["upstream-rt", "upstream-rt"])
        }
    }

    @Test func anUnknownOutcomeIsNotRetriedAndTheAppIsToldToTryAgain() async throws {
        let upstream = ScriptedUpstream(answer: .failure(.upstreamUnavailable("connection reset").delivered(.unknown)), timeout: .seconds(10))
        try await Fixture.with(upstream) { fixture, refresher in
            let failure = try #require(Self.error(await Self.refresh(refresher, fixture)))
            #expect(failure.code == "temporarily_unavailable")
            #expect(failure.detail == "the authorization server did not confirm the refresh; try again")
            // A single-use token whose refresh may have been spent is sent once, not retried.
            #expect(fixture.upstream.refreshes.count == 1)
            fixture.upstream.answer(with: .success(ScriptedUpstream.rotated))
            #expect(Self.answer(await Self.refresh(refresher, fixture)) == ScriptedUpstream.rotated)
        }
    }

    @Test func aFailedRefreshOfATokenGatehouseNeverSawLeavesItUnbound() async throws {
        let upstream = ScriptedUpstream(answer: .failure(.upstreamUnavailable("down").delivered(.unspent)))
        try await Fixture.with(upstream, bound: false) { fixture, refresher in
            _ = await Self.refresh(refresher, fixture)
            let record = try await fixture.store.passthroughToken(hash: SecureToken.hash("upstream-rt"))
            #expect(record == nil)
            // So another app may still present it (it was never this app's).
            fixture.upstream.answer(with: .success(ScriptedUpstream.rotated))
            #expect(Self.answer(await Self.refresh(refresher, fixture, client: Fixture.otherApp)) == ScriptedUpstream.rotated)
        }
    }

    // MARK: Before any upstream call

    @Test func anotherAppsTokenIsRefusedWithoutAnUpstreamCall() async throws {
        try await Fixture.with { fixture, refresher in
            let stolen = try #require(Self.error(await Self.refresh(refresher, fixture, client: Fixture.otherApp)))
            #expect(stolen.code == "invalid_grant" && stolen.detail == "the refresh token was issued to another app")
            #expect(fixture.upstream.refreshes.isEmpty)
        }
    }

    @Test func anUnknownTokenGoesUpstreamOnlyWhenItsRuleAdmitsIt() async throws {
        try await Fixture.with(bound: false) { fixture, refresher in
            let refused = await Self.refresh(refresher, fixture) { () throws(OAuthError) in throw .invalidGrant("unknown refresh tokens are refused") }
            #expect(Self.error(refused)?.detail == "unknown refresh tokens are refused")
            #expect(fixture.upstream.refreshes.isEmpty)
            #expect(Self.answer(await Self.refresh(refresher, fixture)) == ScriptedUpstream.rotated)
            // Refreshed once, the token is known and bound: the rule is no longer asked.
            let owner = try await refresher.owner(of: "upstream-rt")
            #expect(owner == Fixture.app.clientID)
        }
    }

    @Test func aKnownTokenIsNotPutToTheUnknownTokensRule() async throws {
        try await Fixture.with { fixture, refresher in
            let result = await Self.refresh(refresher, fixture) { () throws(OAuthError) in throw .invalidGrant("asked about a known token") }
            #expect(Self.answer(result) == ScriptedUpstream.rotated)
        }
    }

    /// The store's round trips of a refresh: before the upstream call, one statement reads a
    /// bound token's record and takes its lease; after it, the pair's binding and the answer. A
    /// token never bound is read, admitted, then leased (the lease creates its row).
    @Test func aBoundTokensRefreshReadsAndLeasesInOneStatement() async throws {
        try await Fixture.with { fixture, _ in
            let store = CountingStore(base: fixture.store)
            let result = await Self.refresh(fixture.refresher(store: store), fixture)
            #expect(Self.answer(result) == ScriptedUpstream.rotated)
            #expect(store.calls == ["readAndLease", "bind", "answer"])
        }
        try await Fixture.with(bound: false) { fixture, _ in
            let store = CountingStore(base: fixture.store)
            let result = await Self.refresh(fixture.refresher(store: store), fixture)
            #expect(Self.answer(result) == ScriptedUpstream.rotated)
            #expect(store.calls == ["readAndLease", "acquire", "bind", "answer"])
        }
    }

    @Test func aStoreThatCannotBeReachedIsAServerErrorAndNoUpstreamCall() async throws {
        try await Fixture.with { fixture, _ in
            let refresher = fixture.refresher(store: UnreachableStore())
            let failure = try #require(Self.error(await Self.refresh(refresher, fixture)))
            #expect(failure.code == "server_error" && failure.detail == "Gatehouse cannot reach its store right now")
            #expect(fixture.upstream.refreshes.isEmpty)
        }
    }

    @Test func bindingRecordsTheAppOfBothTokens() async throws {
        try await Fixture.with(bound: false) { fixture, refresher in
            let before = try await refresher.owner(of: "upstream-at")
            await refresher.bind(Fixture.signIn, to: Fixture.app)
            let owners = (try await refresher.owner(of: "upstream-at"), try await refresher.owner(of: "upstream-rt"))
            // The store keeps hashes only.
            let byToken = try await fixture.store.passthroughToken(hash: "upstream-rt")
            #expect(before == nil)
            #expect(owners.0 == Fixture.app.clientID && owners.1 == Fixture.app.clientID)
            #expect(byToken == nil)
        }
    }
}
