public import Foundation

/// What Gatehouse remembers about an upstream token it handed to a passthrough app: which app
/// it went to, and once it has been used as a refresh token, who is refreshing it and the answer
/// (sealed under a key derived from the token itself). Keyed by the token's SHA-256: the store
/// never holds a usable token.
public struct PassthroughTokenRecord: Sendable, Equatable {
    public var hash: String
    public var clientID: String
    public var upstream: String
    public var expiresAt: Date
    /// The instance refreshing this token, and until when its lease runs.
    public var leaseOwner: String?
    public var leaseUntil: Date?
    /// When the upstream answered the refresh of this token (or refused it).
    public var answeredAt: Date?
    /// The upstream's answer, sealed under the old refresh token; `nil` with `answeredAt` set
    /// means the upstream refused the token (`invalid_grant`).
    public var answerSealed: Data?
    /// Whether the answer replaced the refresh token (the old one is then spent).
    public var rotated: Bool

    public init(hash: String, clientID: String, upstream: String, expiresAt: Date, leaseOwner: String? = nil, leaseUntil: Date? = nil,
                answeredAt: Date? = nil, answerSealed: Data? = nil, rotated: Bool = false) {
        self.hash = hash
        self.clientID = clientID
        self.upstream = upstream
        self.expiresAt = expiresAt
        self.leaseOwner = leaseOwner
        self.leaseUntil = leaseUntil
        self.answeredAt = answeredAt
        self.answerSealed = answerSealed
        self.rotated = rotated
    }
}

/// Passthrough tokens: their binding to an app, and the coordination that makes concurrent
/// refreshes of one upstream refresh token a single upstream call across every instance.
/// Each compare-and-set is one atomic statement.
public protocol PassthroughTokenStore: Sendable {
    /// Binds tokens handed to an app (no effect on a hash already known).
    func bindPassthroughTokens(_ tokens: [(hash: String, expiresAt: Date)], clientID: String, upstream: String) async throws
    func passthroughToken(hash: String) async throws -> PassthroughTokenRecord?
    /// Takes the right to refresh the token until `until`: creates the row when the token was never
    /// bound, and succeeds only when no live lease is held by another instance and no answer within
    /// `answeredBefore` stands (an answer that did not rotate the token may be refreshed again once
    /// older than that). `false` otherwise.
    func acquirePassthroughRefresh(hash: String, clientID: String, upstream: String, owner: String, until: Date, now: Date,
                                   answeredBefore: Date, expiresAt: Date) async throws -> Bool
    /// Reads the token's record and, in the same statement, takes the lease for `owner` when
    /// `acquirePassthroughRefresh` would (the record is `clientID`'s, no live lease, no answer
    /// within `answeredBefore` stands). A token never bound is only read (`nil`), never created:
    /// whether an unknown token may be refreshed is decided before it is written.
    /// The record as the lease left it when taken, else as it stands.
    func readPassthroughRefresh(hash: String, clientID: String, owner: String, until: Date, now: Date,
                                answeredBefore: Date) async throws -> PassthroughLeaseAttempt
    /// Stores the upstream's answer (or its refusal, `sealed == nil`) and ends the lease, if no
    /// answer is stored yet (the first answer wins; a pair also replaces a refusal, which can only
    /// come from a holder whose token another holder had just spent); `false` otherwise.
    func answerPassthroughRefresh(hash: String, sealed: Data?, rotated: Bool, now: Date, keepUntil: Date) async throws -> Bool
    /// Gives up a lease without an answer (the upstream could not be asked, or its answer is
    /// unknown); with `forget`, deletes the row (a token first seen by this refresh stays unbound).
    func releasePassthroughRefresh(hash: String, owner: String, forget: Bool) async throws
}

/// A token's record, read in the statement that took its lease when it could be taken.
public struct PassthroughLeaseAttempt: Sendable, Equatable {
    public var record: PassthroughTokenRecord?
    /// Whether this statement took the lease (for the owner it was given).
    public var leased: Bool

    public init(record: PassthroughTokenRecord?, leased: Bool) {
        self.record = record
        self.leased = leased
    }
}

extension PassthroughTokenStore {
    /// In two statements, for a store without its own (a read, then the lease when the record's
    /// decision is to refresh): the same outcome, one more round trip.
    public func readPassthroughRefresh(hash: String, clientID: String, owner: String, until: Date, now: Date,
                                       answeredBefore: Date) async throws -> PassthroughLeaseAttempt {
        guard let record = try await passthroughToken(hash: hash) else { return PassthroughLeaseAttempt(record: nil, leased: false) }
        let leaseFree = record.leaseUntil.map { $0 <= now } ?? true || record.leaseOwner == owner
        let answerAllows = record.answeredAt.map { !record.rotated && record.answerSealed != nil && $0 < answeredBefore } ?? true
        guard record.clientID == clientID, leaseFree, answerAllows,
              try await acquirePassthroughRefresh(hash: hash, clientID: clientID, upstream: record.upstream, owner: owner, until: until,
                                                  now: now, answeredBefore: answeredBefore, expiresAt: record.expiresAt) else {
            return PassthroughLeaseAttempt(record: record, leased: false)
        }
        var leased = record
        (leased.leaseOwner, leased.leaseUntil, leased.answeredAt, leased.answerSealed, leased.rotated) = (owner, until, nil, nil, false)
        return PassthroughLeaseAttempt(record: leased, leased: true)
    }
}

/// The refresh of a passthrough token as a decision over its stored record.
public enum PassthroughRefresh {
    public enum Decision: Equatable, Sendable {
        /// Nobody holds or has the answer: take the lease and ask the upstream.
        case refresh
        /// Another instance is asking the upstream right now: wait for its answer.
        case wait
        /// The upstream answered within the grace window: answer the same pair.
        case replay(Data)
        /// Spent (answered and rotated, after the window) or refused by the upstream.
        case refuse
        /// Handed to another app.
        case otherClient
    }

    public static func decide(_ record: PassthroughTokenRecord?, clientID: String, now: Date, grace: Duration) -> Decision {
        guard let record else { return .refresh }
        guard record.clientID == clientID else { return .otherClient }
        if let answeredAt = record.answeredAt {
            guard let answer = record.answerSealed else { return .refuse }
            if now.timeIntervalSince(answeredAt) <= grace.inSeconds { return .replay(answer) }
            return record.rotated ? .refuse : .refresh
        }
        if let owner = record.leaseOwner, !owner.isEmpty, let until = record.leaseUntil, until > now { return .wait }
        return .refresh
    }
}
