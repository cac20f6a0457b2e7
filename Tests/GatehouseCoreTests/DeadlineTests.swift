import GatehouseCore
import Testing

struct DeadlineTests {
    struct TimedOut: Error {}

    @Test func anOperationWithinItsDeadlineAnswers() async throws {
        #expect(try await withDeadline(.seconds(5), orThrow: { TimedOut() }) { 42 } == 42)
    }

    @Test func anOperationPastItsDeadlineIsCancelledAndTheGivenErrorThrown() async throws {
        await #expect(throws: TimedOut.self) {
            try await withDeadline(.milliseconds(50), orThrow: { TimedOut() }) {
                // Never finishes on its own: only cancellation ends it.
                try await Task.sleep(for: .seconds(3600))
                return 0
            }
        }
    }
}
