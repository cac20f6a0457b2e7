@testable import GatehouseSessions
import Testing

/// One piece of work per key at a time: whoever asks while it runs gets the same result.
///
/// The callers run on one serial executor, and each arrives and calls `run` in one step, so
/// when the test opens the gate every caller has already joined (or started) the work: a second
/// call can only come from the coalescer, never from a caller that was late.
struct CoalescerTests {
    struct Failure: Error, Equatable {
        let reason: String
    }

    /// Runs `callers` concurrent callers of `key(i)`; the work counts itself and waits at a gate
    /// that opens once every caller has called `run`. Returns each caller's result and whether it
    /// joined, and how many times the work ran (`answer` is given the call's number, from 1).
    static func race<Value: Sendable>(callers: Int, key: @escaping @Sendable (Int) -> String = { _ in "one" },
                                      answer: @escaping @Sendable (Int) -> Value) async -> (results: [(value: Value, joined: Bool)], calls: Int) {
        let coalescer = Coalescer<Value>()
        let calls = Counter()
        let arrivals = Arrivals()
        let gate = Gate()
        let results = await withTaskExecutorPreference(SerialTaskExecutor()) {
            await withTaskGroup(of: (value: Value, joined: Bool)?.self) { group in
                for caller in 0..<callers {
                    group.addTask {
                        arrivals.arrive()
                        return await coalescer.run(key(caller)) {
                            let call = calls.next()
                            await gate.wait()
                            return answer(call)
                        }
                    }
                }
                group.addTask {
                    await arrivals.reached(callers)
                    gate.open()
                    return nil
                }
                var results: [(value: Value, joined: Bool)] = []
                for await case let result? in group { results.append(result) }
                return results
            }
        }
        return (results, calls.count)
    }

    @Test func concurrentCallersOfOneKeyShareOneCall() async {
        let (results, calls) = await Self.race(callers: 20) { call in call }
        #expect(calls == 1)
        #expect(results.count == 20 && results.allSatisfy { $0.value == 1 })
        // One started the work; the nineteen others joined it.
        #expect(results.filter(\.joined).count == 19)
    }

    @Test func differentKeysDoNotShare() async {
        let (results, calls) = await Self.race(callers: 6, key: { "key-\($0 % 3)" }) { call in call }
        #expect(calls == 3)
        #expect(Set(results.map(\.value)) == [1, 2, 3])
        // Each key's two callers: one ran its work, the other joined it.
        #expect(results.filter(\.joined).count == 3)
        for value in 1...3 { #expect(results.filter { $0.value == value }.count == 2) }
    }

    @Test func aFailureReachesEveryWaiter() async {
        let (results, calls) = await Self.race(callers: 10) { _ -> Result<Int, Failure> in .failure(Failure(reason: "upstream said no")) }
        #expect(calls == 1)
        #expect(results.count == 10)
        #expect(results.allSatisfy { $0.value == .failure(Failure(reason: "upstream said no")) })
    }

    @Test func afterTheWorkEndsTheNextCallRunsItAgain() async {
        let coalescer = Coalescer<Int>()
        let calls = Counter()
        let first = await coalescer.run("one") { calls.next() }
        let second = await coalescer.run("one") { calls.next() }
        #expect(first.value == 1 && !first.joined)
        #expect(second.value == 2 && !second.joined)
        // A failure is not kept either: the call after it runs the work afresh.
        let failing = Coalescer<Result<Int, Failure>>()
        _ = await failing.run("one") { .failure(Failure(reason: "once")) }
        #expect(await failing.run("one") { .success(1) }.value == .success(1))
    }
}
