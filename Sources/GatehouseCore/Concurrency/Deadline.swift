/// Runs `operation` within `limit`; past it the operation is cancelled and `timeout()` thrown.
/// The one deadline for work whose own timeouts do not cover all of it: a whole upstream exchange
/// (AsyncHTTPClient's deadline stops at the response head) and a store query (waiting for a
/// pooled connection included).
public func withDeadline<Value: Sendable>(_ limit: Duration, orThrow timeout: @escaping @Sendable () -> any Error,
                                          _ operation: @escaping @Sendable () async throws -> Value) async throws -> Value {
    try await withThrowingTaskGroup(of: Value?.self) { group in
        group.addTask { try await operation() }
        group.addTask {
            try await Task.sleep(for: limit)
            return nil
        }
        defer { group.cancelAll() }
        guard let first = try await group.next(), let value = first else { throw timeout() }
        return value
    }
}
