import Foundation
import GatehouseCore
import GatehouseRelay
import GatehouseStore
import Logging
import ServiceLifecycle

/// What one instance tells the others when it revokes something (PostgreSQL `NOTIFY` payloads).
/// Neither carries a token: a session id, and the identity cache's key (a SHA-256).
enum RevocationMessage: Equatable {
    /// Drop the in-memory view of this session.
    case session(String)
    /// Drop this identity-cache entry.
    case identity(TokenKey)

    var text: String {
        switch self {
        case .session(let id): "session " + id
        case .identity(let key): "identity " + key.hex
        }
    }

    init?(_ text: String) {
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
    /// Tells the other instances; when it cannot, they stop honouring the revocation when their
    /// cached views expire (at most 10 s), so a failure is logged, not thrown.
    func announce(_ message: RevocationMessage, logger: Logger) async {
        do { try await announceRevocation(message.text) } catch {
            logger.warning("could not announce a revocation to other instances; they stop honouring it within 10 s")
        }
    }
}

/// Listens for other instances' revocations and drops what this instance caches about them, so
/// a session revoked on instance A stops working on instance B within milliseconds instead of
/// when B's cached view expires. Reconnects (every second) when the connection is lost.
struct RevocationListener: Service {
    let store: PostgresStore
    let sessions: SessionServices?
    let identityCache: IdentityCache?
    let logger: Logger

    func run() async throws {
        try? await cancelWhenGracefulShutdown {
            while !Task.isCancelled {
                do {
                    try await store.listenForRevocations(onListening: {
                        logger.debug("listening for revocations from other instances")
                    }) { payload in
                        apply(payload)
                    }
                } catch {
                    guard !Task.isCancelled else { return }
                    logger.warning("lost the revocation channel; listening again",
                                   metadata: ["error_type": .string(String(describing: type(of: error)))])
                }
                try await Task.sleep(for: .seconds(1))
            }
        }
    }

    func apply(_ payload: String) {
        switch RevocationMessage(payload) {
        case .session(let id)?: sessions?.views.dropSession(id)
        case .identity(let key)?: identityCache?.invalidate(key: key)
        case nil: logger.warning("ignored an unreadable revocation message")
        }
    }
}
