public import Foundation

/// A sealed session: what Gatehouse holds for one sign-in of one app. The upstream tokens are
/// in `sealedTokens`, encrypted under `keyID` with the session id as associated data.
public struct SessionRecord: Sendable, Equatable {
    public var id: String
    public var clientID: String
    public var upstream: String
    public var subject: String?
    public var keyID: String
    public var sealedTokens: Data
    /// When the upstream access token expires (refreshed shortly before).
    public var upstreamExpiresAt: Date?
    /// Bumped by every write of the upstream tokens: a writer holding an older version loses (fencing).
    public var version: Int
    public var createdAt: Date
    public var expiresAt: Date
    public var revokedAt: Date?
    /// The instance holding the right to refresh the upstream tokens, as read (never written
    /// through the record). A lease that ran out keeps its owner; one given up has none.
    public var leaseOwner: String?
    public var leaseUntil: Date?
    /// The thumbprint of the DPoP key the session's tokens are bound to (RFC 9449 `cnf.jkt`).
    public var dpopJKT: String?

    public init(id: String, clientID: String, upstream: String, subject: String?, keyID: String, sealedTokens: Data,
                upstreamExpiresAt: Date?, version: Int = 1, createdAt: Date, expiresAt: Date, revokedAt: Date? = nil,
                leaseOwner: String? = nil, leaseUntil: Date? = nil, dpopJKT: String? = nil) {
        self.dpopJKT = dpopJKT
        self.id = id
        self.clientID = clientID
        self.upstream = upstream
        self.subject = subject
        self.keyID = keyID
        self.sealedTokens = sealedTokens
        self.upstreamExpiresAt = upstreamExpiresAt
        self.version = version
        self.createdAt = createdAt
        self.expiresAt = expiresAt
        self.revokedAt = revokedAt
        self.leaseOwner = leaseOwner
        self.leaseUntil = leaseUntil
    }

    public func isLive(at now: Date) -> Bool { revokedAt == nil && expiresAt > now }
}

/// One of Gatehouse's refresh tokens, as stored: only its hash, its session, and once it has
/// been used, when and the pair that replaced it (sealed under a key derived from the token
/// itself, so only a holder of the old token can read it, within the grace window).
public struct RefreshTokenRecord: Sendable, Equatable {
    public var hash: String
    public var sessionID: String
    public var expiresAt: Date
    public var replacedAt: Date?
    public var successorSealed: Data?

    public init(hash: String, sessionID: String, expiresAt: Date, replacedAt: Date? = nil, successorSealed: Data? = nil) {
        self.hash = hash
        self.sessionID = sessionID
        self.expiresAt = expiresAt
        self.replacedAt = replacedAt
        self.successorSealed = successorSealed
    }
}
