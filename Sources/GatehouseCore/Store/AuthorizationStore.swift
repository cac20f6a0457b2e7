public import Foundation

/// Durable, shared state of sign-ins in flight. One protocol, one implementation per database.
///
/// Single use is the store's job: `consume…` deletes and returns a row in one atomic
/// statement, so of two racing callers exactly one gets the value and the other `nil`.
/// Expired rows are never returned, whether or not the sweeper has run yet.
public protocol AuthorizationStore: Sendable {
    /// Records a sealed transaction (`AuthorizationTransaction.sealed(with:)`) under the hash of Gatehouse's `state`.
    func insertTransaction(sealed: Data, stateHash: String, expiresAt: Date) async throws
    /// Deletes and returns the sealed transaction, or `nil` when unknown, used or expired at `now`.
    func consumeTransaction(stateHash: String, now: Date) async throws -> Data?
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

/// Everything Gatehouse keeps: sign-ins in flight, sealed sessions, passthrough tokens,
/// registered app instances, single-use values and paused certifications.
public typealias GatehouseStore = AuthorizationStore & SessionStore & PassthroughTokenStore & RevocationAnnouncer
    & InstanceStore & SingleUseStore & CertificationStore & AttemptCounterStore

/// Tells every instance sharing the store that something was revoked, so each drops what it
/// caches about it at once (PostgreSQL `NOTIFY`). A store used by one instance does nothing.
public protocol RevocationAnnouncer: Sendable {
    func announceRevocation(_ message: String) async throws
}
