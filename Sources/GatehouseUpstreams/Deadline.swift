import AsyncHTTPClient

/// Runs `operation` (a whole exchange: request, response head and body) within `limit`.
/// AsyncHTTPClient's own deadline stops at the response head, so an upstream that sends a head
/// and then stalls would otherwise hold a refresh, and its lease, for ever. Past the limit the
/// operation is cancelled and `HTTPClientError.deadlineExceeded` thrown (an unknown outcome).
func withDeadline<Value: Sendable>(_ limit: Duration, _ operation: @escaping @Sendable () async throws -> Value) async throws -> Value {
    try await withThrowingTaskGroup(of: Value?.self) { group in
        group.addTask { try await operation() }
        group.addTask {
            try await Task.sleep(for: limit)
            return nil
        }
        defer { group.cancelAll() }
        guard let first = try await group.next(), let value = first else { throw HTTPClientError.deadlineExceeded }
        return value
    }
}
