package import GatehouseCore
package import GatehouseRelay
package import Logging

/// What one instance tells the others when it revokes something (PostgreSQL `NOTIFY` payloads).
/// Neither carries a token: a session id, and the identity cache's key (a SHA-256).
package enum RevocationMessage: Equatable {
    /// Drop the in-memory view of this session.
    case session(String)
    /// Drop this identity-cache entry.
    case identity(TokenKey)

    package var text: String {
        switch self {
        case .session(let id): "session " + id
        case .identity(let key): "identity " + key.hex
        }
    }

    package init?(_ text: String) {
        let parts = text.split(separator: " ", maxSplits: 1)
        guard parts.count == 2 else { return nil }
        switch parts[0] {
        case "session": self = .session(String(parts[1]))
        case "identity":
            guard let key = TokenKey(hex: parts[1]) else { return nil }
            self = .identity(key)
        default: return nil
        }
    }
}

extension RevocationAnnouncer {
    /// Tells the other instances; when it cannot, they stop honouring a revoked session when
    /// their cached views of it expire (at most 10 s: the store says it is revoked), so a failure
    /// is logged, not thrown. (A passthrough token's revocation, which only the announcement
    /// carries, is announced with `announceRevocation` and answered 503 when that fails.)
    package func announce(_ message: RevocationMessage, logger: Logger) async {
        do { try await announceRevocation(message.text) } catch {
            logger.warning("could not announce a revocation to other instances; they stop honouring the session within 10 s")
        }
    }
}
