import AsyncHTTPClient
import Foundation
import GatehouseCore
@testable import GatehouseRelay
import MetricsTestKit
import Synchronization
import Testing

/// A barrier: every `wait` returns once `open` has been called.
final class Gate: Sendable {
    private struct State {
        var isOpen = false
        var waiters: [CheckedContinuation<Void, Never>] = []
    }

    private let state = Mutex(State())

    func wait() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let passes = state.withLock { state in
                if state.isOpen { return true }
                state.waiters.append(continuation)
                return false
            }
            if passes { continuation.resume() }
        }
    }

    func open() {
        let waiters = state.withLock { state in
            state.isOpen = true
            defer { state.waiters = [] }
            return state.waiters
        }
        for waiter in waiters { waiter.resume() }
    }
}

/// An identity service held behind a gate, remembering how many calls it had at once.
final class GatedIdentityService: Sendable {
    enum Event: Sendable { case entered, refused }

    let gate = Gate()
    let events: AsyncStream<Event>
    let sink: AsyncStream<Event>.Continuation
    private let load = Mutex((inFlight: 0, peak: 0, calls: 0))

    init() {
        let stream = AsyncStream.makeStream(of: Event.self)
        events = stream.stream
        sink = stream.continuation
    }

    var peak: Int { load.withLock { $0.peak } }
    var calls: Int { load.withLock { $0.calls } }

    var transport: IdentityHTTP.Transport {
        { _, _ in
            self.load.withLock { load in
                load.inFlight += 1
                load.calls += 1
                load.peak = max(load.peak, load.inFlight)
            }
            self.sink.yield(.entered)
            await self.gate.wait()
            self.load.withLock { $0.inFlight -= 1 }
            return (200, Data(#"{"sub":"alice"}"#.utf8))
        }
    }
}

/// Statuses (or transport failures) an identity service answers, in order.
final class Script: Sendable {
    private let answers: Mutex<[Result<Int, HTTPClientError>]>

    init(_ answers: [Result<Int, HTTPClientError>]) {
        self.answers = Mutex(answers)
    }

    func next() -> Result<Int, HTTPClientError> {
        answers.withLock { $0.isEmpty ? .success(500) : $0.removeFirst() }
    }
}

/// Identity calls are capped per identity service (`identity_concurrency`): never more in flight,
/// as many waiting, and the rest refused at once without a call (spec §6). The identity cache
/// counts its hits, misses, coalesced waits, negative hits, evictions and entries (spec §3).
struct IdentityLimitsTests {
    static let settings = IdentitySettings(kind: .userinfo, url: "https://idp.example/userinfo")

    static func resolve(_ resolver: some IdentityResolver, _ token: String) async -> Result<IdentityResolution, IdentityUnavailable> {
        do throws(IdentityUnavailable) {
            return .success(try await resolver.resolve(token: token))
        } catch {
            return .failure(error)
        }
    }

    @Test(.timeLimit(.minutes(1)))
    func identityCallsNeverExceedTheLimitAndTheExcessFailsFast() async throws {
        let service = GatedIdentityService()
        let metrics = TestMetrics()
        let limit = ConcurrencyLimit(limit: 2)
        let resolver = UserinfoResolver(settings: Self.settings, http: IdentityHTTP(upstream: "idp", timeout: .seconds(5), limit: limit,
                                                                                   metrics: metrics, transport: service.transport))
        let results = await withTaskGroup(of: Result<IdentityResolution, IdentityUnavailable>.self) { group in
            for index in 0..<10 {
                group.addTask {
                    let result = await Self.resolve(resolver, "token-\(index)")
                    if case .failure(let error) = result, error.reason == .overloaded { service.sink.yield(.refused) }
                    return result
                }
            }
            // Two calls at the service, two waiting their turn: the other six are refused at once.
            var (entered, refused) = (0, 0)
            for await event in service.events {
                if event == .entered { entered += 1 } else { refused += 1 }
                if entered + refused == 8 { break }
            }
            #expect(entered == 2 && refused == 6)
            #expect(limit.running == 2 && limit.waiting == 2)
            service.gate.open()
            return await group.reduce(into: []) { $0.append($1) }
        }
        #expect(results.filter { $0.success != nil }.count == 4)
        #expect(results.filter { $0.failure?.reason == .overloaded }.count == 6)
        #expect(service.peak == 2)
        #expect(service.calls == 4)
        #expect(metrics.counterTotal(label: GatehouseMetrics.rateLimitedTotal, dimensions: [("limit", "identity_concurrency")]) == 6)
        #expect(metrics.counterTotal(label: GatehouseMetrics.upstreamRequestsTotal,
                                     dimensions: [("upstream", "idp"), ("endpoint", "identity"), ("outcome", "ok")]) == 4)
    }

    @Test func identityCallsAreCountedByOutcome() async throws {
        let metrics = TestMetrics()
        let script = Script([.success(401), .success(503), .failure(.deadlineExceeded), .failure(.connectTimeout)])
        let http = IdentityHTTP(upstream: "idp", timeout: .seconds(5), limit: ConcurrencyLimit(limit: 4), metrics: metrics) { _, _ in
            (try script.next().get(), Data())
        }
        let resolver = UserinfoResolver(settings: Self.settings, http: http)
        #expect(await Self.resolve(resolver, "a").success == .inactive)
        #expect(await Self.resolve(resolver, "b").failure?.reason == .badResponse)
        #expect(await Self.resolve(resolver, "c").failure?.reason == .timeout)
        #expect(await Self.resolve(resolver, "d").failure?.reason == .unreachable)
        for outcome in ["4xx", "5xx", "timeout", "unreachable"] {
            #expect(metrics.counterTotal(label: GatehouseMetrics.upstreamRequestsTotal,
                                         dimensions: [("upstream", "idp"), ("endpoint", "identity"), ("outcome", outcome)]) == 1, "\(outcome)")
        }
        let timer = try metrics.expectTimer(GatehouseMetrics.upstreamRequestDuration, [("upstream", "idp"), ("endpoint", "identity")])
        #expect(timer.values.count == 4)
    }

    // MARK: Identity cache

    static func lookups(_ metrics: TestMetrics, _ result: String) -> Int64 {
        metrics.counterTotal(label: GatehouseMetrics.identityCacheLookupsTotal, dimensions: [("result", result)])
    }

    @Test func cacheLookupsEvictionsAndEntriesAreCounted() async throws {
        let metrics = TestMetrics()
        let cache = IdentityCache(maximumEntries: 2, metrics: metrics)
        let good = CountingResolver(answer: .success(.active(IdentityCacheTests.alice)))
        let bad = CountingResolver(answer: .success(.inactive))
        func resolve(_ token: String, _ resolver: CountingResolver) async throws -> IdentityResolution {
            try await cache.resolve(token: token, upstream: "u", ttl: .seconds(60), negativeTTL: .seconds(10), resolver: resolver)
        }

        _ = try await resolve("a", good)
        _ = try await resolve("a", good)
        #expect(cache.peek(token: "a", upstream: "u") == .active(IdentityCacheTests.alice))
        // A look before the request's own look-up (the per-address limit's) is not a look-up.
        #expect(cache.peek(token: "a", upstream: "u", counting: false) == .active(IdentityCacheTests.alice))
        _ = try await resolve("junk", bad)
        _ = try await resolve("junk", bad)
        // The fast path declines a rejected token; the general path counts it.
        #expect(cache.peek(token: "junk", upstream: "u") == .inactive)
        #expect(cache.peek(token: "never", upstream: "u") == nil)
        #expect(Self.lookups(metrics, "miss") == 2)
        #expect(Self.lookups(metrics, "hit") == 2)
        #expect(Self.lookups(metrics, "negative_hit") == 1)
        #expect(metrics.counterTotal(label: GatehouseMetrics.identityCacheEvictionsTotal) == 0)

        _ = try await resolve("c", good)  // "a" is the least recently used
        #expect(metrics.counterTotal(label: GatehouseMetrics.identityCacheEvictionsTotal) == 1)
        #expect(try metrics.expectGauge(GatehouseMetrics.identityCacheEntries).lastValue == 2)
        cache.invalidate(token: "c", upstream: "u")
        #expect(try metrics.expectGauge(GatehouseMetrics.identityCacheEntries).lastValue == 1)
    }

    @Test(.timeLimit(.minutes(1)))
    func aLookupThatJoinsACallUnderWayIsCoalesced() async throws {
        let metrics = TestMetrics()
        let cache = IdentityCache(maximumEntries: 10, metrics: metrics)
        let service = GatedIdentityService()
        let resolver = UserinfoResolver(settings: Self.settings, http: IdentityHTTP(upstream: "idp", timeout: .seconds(5),
                                                                                   limit: ConcurrencyLimit(limit: 4), transport: service.transport))
        func resolve() async throws -> IdentityResolution {
            try await cache.resolve(token: "t", upstream: "u", ttl: .seconds(60), negativeTTL: .zero, resolver: resolver)
        }
        async let first = resolve()
        for await event in service.events where event == .entered { break }
        async let second = resolve()
        // The second lookup has found the call under way once it is counted.
        while Self.lookups(metrics, "coalesced") == 0 { await Task.yield() }
        service.gate.open()
        #expect(try await first == second)
        #expect(service.calls == 1)
        #expect(Self.lookups(metrics, "miss") == 1)
        #expect(Self.lookups(metrics, "coalesced") == 1)
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
