import Foundation
import GatehouseCore
import GatehouseRelay
import GatehouseSessions
import GatehouseStore
import Logging
import ServiceLifecycle

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
