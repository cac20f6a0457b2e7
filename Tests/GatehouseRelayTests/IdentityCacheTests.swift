import Foundation
import GatehouseCore
import GatehouseRelay
import Synchronization
import Testing

/// An identity service that counts its calls and can be held until the test releases it.
final class CountingResolver: IdentityResolver {
    let calls = Atomic<Int>(0)
    let answer: Result<IdentityResolution, IdentityUnavailable>
    let delay: Duration

    init(answer: Result<IdentityResolution, IdentityUnavailable>, delay: Duration = .zero) {
        self.answer = answer
        self.delay = delay
    }

    func resolve(token: String) async throws(IdentityUnavailable) -> IdentityResolution {
        calls.add(1, ordering: .relaxed)
        if delay > .zero { try? await Task.sleep(for: delay) }
        return try answer.get()
    }
}

final class TestClock: Sendable {
    let milliseconds = Atomic<Int64>(1_000_000)
    func advance(_ duration: Duration) { milliseconds.add(duration.components.seconds * 1000, ordering: .relaxed) }
}

struct IdentityCacheTests {
    static let alice = CallerIdentity(subject: "alice", bpid: "1000123", scopes: ["read"], attributes: ["bpid_status": "active"], expiresAt: nil)

    @Test func concurrentMissesForOneTokenMakeOneIdentityCall() async throws {
        let cache = IdentityCache(maximumEntries: 100)
        let resolver = CountingResolver(answer: .success(.active(Self.alice)), delay: .milliseconds(200))
        let results = try await withThrowingTaskGroup(of: IdentityResolution.self) { group in
            for _ in 0..<200 {
                group.addTask { try await cache.resolve(token: "t", upstream: "u", ttl: .seconds(60), negativeTTL: .seconds(10), resolver: resolver) }
            }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        #expect(results.count == 200)
        #expect(results.allSatisfy { $0 == .active(Self.alice) })
        #expect(resolver.calls.load(ordering: .relaxed) == 1)
    }

    @Test func rejectedTokensAreRememberedForTheNegativeTTL() async throws {
        let clock = TestClock()
        let cache = IdentityCache(maximumEntries: 100, now: { clock.milliseconds.load(ordering: .relaxed) })
        let resolver = CountingResolver(answer: .success(.inactive))
        for _ in 0..<100 {
            #expect(try await cache.resolve(token: "bad", upstream: "u", ttl: .seconds(60), negativeTTL: .seconds(10), resolver: resolver) == .inactive)
        }
        #expect(resolver.calls.load(ordering: .relaxed) == 1)
        clock.advance(.seconds(11))
        _ = try await cache.resolve(token: "bad", upstream: "u", ttl: .seconds(60), negativeTTL: .seconds(10), resolver: resolver)
        #expect(resolver.calls.load(ordering: .relaxed) == 2)
    }

    @Test func outagesAreNeverCached() async {
        let cache = IdentityCache(maximumEntries: 100)
        let resolver = CountingResolver(answer: .failure(IdentityUnavailable(.unreachable, "down")))
        for _ in 0..<3 {
            await #expect(throws: IdentityUnavailable.self) {
                try await cache.resolve(token: "t", upstream: "u", ttl: .seconds(60), negativeTTL: .seconds(10), resolver: resolver)
            }
        }
        #expect(resolver.calls.load(ordering: .relaxed) == 3)
    }

    @Test func entryLivesNoLongerThanTheTokenItself() async throws {
        let clock = TestClock()
        let cache = IdentityCache(maximumEntries: 100, now: { clock.milliseconds.load(ordering: .relaxed) })
        // The token's expiry is wall-clock time (read when the entry is stored): 50 s of it, so a
        // machine that stalls the test for seconds still stores an entry that outlives 40.
        let shortLived = CallerIdentity(subject: "a", bpid: nil, scopes: nil, attributes: [:], expiresAt: Date().addingTimeInterval(50))
        let resolver = CountingResolver(answer: .success(.active(shortLived)))
        _ = try await cache.resolve(token: "t", upstream: "u", ttl: .seconds(300), negativeTTL: .zero, resolver: resolver)
        clock.advance(.seconds(40))
        _ = try await cache.resolve(token: "t", upstream: "u", ttl: .seconds(300), negativeTTL: .zero, resolver: resolver)
        #expect(resolver.calls.load(ordering: .relaxed) == 1)
        clock.advance(.seconds(20))
        _ = try await cache.resolve(token: "t", upstream: "u", ttl: .seconds(300), negativeTTL: .zero, resolver: resolver)
        #expect(resolver.calls.load(ordering: .relaxed) == 2)
    }

    /// An `exp` no clock reaches (an identity service's 1e300) is a life as long as the cache's
    /// own, never a trap converting it; one in the past is not cached at all.
    @Test func anAbsurdExpiryIsTheCachesOwnLifetime() async throws {
        let clock = TestClock()
        let cache = IdentityCache(maximumEntries: 100, now: { clock.milliseconds.load(ordering: .relaxed) })
        let far = CallerIdentity(subject: "a", bpid: nil, scopes: nil, attributes: [:], expiresAt: Date(timeIntervalSinceReferenceDate: 1e300))
        let resolver = CountingResolver(answer: .success(.active(far)))
        _ = try await cache.resolve(token: "t", upstream: "u", ttl: .seconds(300), negativeTTL: .zero, resolver: resolver)
        clock.advance(.seconds(299))
        _ = try await cache.resolve(token: "t", upstream: "u", ttl: .seconds(300), negativeTTL: .zero, resolver: resolver)
        #expect(resolver.calls.load(ordering: .relaxed) == 1)
        clock.advance(.seconds(2))
        _ = try await cache.resolve(token: "t", upstream: "u", ttl: .seconds(300), negativeTTL: .zero, resolver: resolver)
        #expect(resolver.calls.load(ordering: .relaxed) == 2)
        let past = CallerIdentity(subject: "b", bpid: nil, scopes: nil, attributes: [:], expiresAt: Date(timeIntervalSinceReferenceDate: -1e300))
        let expired = CountingResolver(answer: .success(.active(past)))
        _ = try await cache.resolve(token: "p", upstream: "u", ttl: .seconds(300), negativeTTL: .zero, resolver: expired)
        _ = try await cache.resolve(token: "p", upstream: "u", ttl: .seconds(300), negativeTTL: .zero, resolver: expired)
        #expect(expired.calls.load(ordering: .relaxed) == 2)
        #expect(ForwardAuthAllow.cacheSeconds(scheme: .bearer, maxAge: .seconds(5), cacheTTL: nil, expiresAt: far.expiresAt, now: Date()) == 5)
        #expect(ForwardAuthAllow.cacheSeconds(scheme: .bearer, maxAge: .seconds(5), cacheTTL: nil, expiresAt: past.expiresAt, now: Date()) == 0)
        #expect(ForwardAuthAllow.cacheSeconds(scheme: .dpop, maxAge: .seconds(5), cacheTTL: nil, expiresAt: nil, now: Date()) == 0)
    }

    @Test func leastRecentlyUsedIsEvictedAtCapacity() async throws {
        let cache = IdentityCache(maximumEntries: 2)
        let resolver = CountingResolver(answer: .success(.active(Self.alice)))
        func use(_ token: String) async throws {
            _ = try await cache.resolve(token: token, upstream: "u", ttl: .seconds(60), negativeTTL: .zero, resolver: resolver)
        }
        try await use("a")
        try await use("b")
        try await use("a")  // a is now the most recent
        try await use("c")  // evicts b
        #expect(cache.count == 2)
        let before = resolver.calls.load(ordering: .relaxed)
        try await use("a")
        #expect(resolver.calls.load(ordering: .relaxed) == before)
        try await use("b")
        #expect(resolver.calls.load(ordering: .relaxed) == before + 1)
    }

    @Test func sameTokenAtAnotherUpstreamIsAnotherEntry() async throws {
        let cache = IdentityCache(maximumEntries: 10)
        let resolver = CountingResolver(answer: .success(.active(Self.alice)))
        _ = try await cache.resolve(token: "t", upstream: "one", ttl: .seconds(60), negativeTTL: .zero, resolver: resolver)
        _ = try await cache.resolve(token: "t", upstream: "two", ttl: .seconds(60), negativeTTL: .zero, resolver: resolver)
        #expect(resolver.calls.load(ordering: .relaxed) == 2)
    }

    @Test func invalidatedTokenIsAskedAgain() async throws {
        let cache = IdentityCache(maximumEntries: 10)
        let resolver = CountingResolver(answer: .success(.active(Self.alice)))
        _ = try await cache.resolve(token: "t", upstream: "u", ttl: .seconds(60), negativeTTL: .zero, resolver: resolver)
        cache.invalidate(token: "t", upstream: "u")
        _ = try await cache.resolve(token: "t", upstream: "u", ttl: .seconds(60), negativeTTL: .zero, resolver: resolver)
        #expect(resolver.calls.load(ordering: .relaxed) == 2)
    }
}
