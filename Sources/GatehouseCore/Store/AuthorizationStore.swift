public import Foundation

/// Durable, shared state of sign-ins in flight. One protocol, one implementation per database.
///
/// Single use is the store's job: `consume…` deletes and returns a row in one atomic
/// statement, so of two racing callers exactly one gets the value and the other `nil`.
/// Expired rows are never returned, whether or not the sweeper has run yet.
public protocol AuthorizationStore: Sendable {
    /// Records a transaction under the hash of Gatehouse's `state`.
    func insertTransaction(_ transaction: AuthorizationTransaction, stateHash: String) async throws
    /// Deletes and returns the transaction, or `nil` when unknown, used or expired at `now`.
    func consumeTransaction(stateHash: String, now: Date) async throws -> AuthorizationTransaction?
    /// Records a sealed `IssuedCode` under the hash of the code.
    func insertCode(sealed: Data, codeHash: String, expiresAt: Date) async throws
    /// Deletes and returns the sealed code, or `nil` when unknown, used or expired at `now`.
    func consumeCode(codeHash: String, now: Date) async throws -> Data?
    /// Deletes everything expired at `now`; returns how many rows went.
    @discardableResult
    func sweepExpired(now: Date) async throws -> Int
    /// Throws when the store cannot serve requests.
    func checkHealth() async throws
}
