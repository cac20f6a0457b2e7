import Foundation
import GatehouseCore
import GatehouseSessions
import Logging
import ServiceLifecycle

/// After `gatehouse keys rotate`, re-seals sessions still under an older key with the active
/// one, a batch at a time, so that the old key can be dropped from the ring later. Re-sealing
/// neither bumps a session's version nor touches a refresh lease; a session written or being
/// refreshed meanwhile is simply skipped until the next round.
struct Reencryption: Service {
    let sessions: SessionServices
    let interval: Duration
    let logger: Logger

    func run() async throws {
        try? await cancelWhenGracefulShutdown {
            while !Task.isCancelled {
                await reencryptBatch()
                try await Task.sleep(for: interval)
            }
        }
    }

    func reencryptBatch() async {
        let ring = sessions.settings.keyRing
        guard let stale = try? await sessions.store.sessionsSealed(notUnder: ring.activeKeyID, limit: 500), !stale.isEmpty else { return }
        var done = 0
        for session in stale {
            guard let plaintext = try? ring.open(session.sealedTokens, keyID: session.keyID, associatedData: session.id),
                  let (keyID, sealed) = try? ring.seal(plaintext, associatedData: session.id) else { continue }
            if (try? await sessions.store.rewrapSession(id: session.id, expectedVersion: session.version, fromKeyID: session.keyID,
                                                        keyID: keyID, sealed: sealed, now: Date())) == true {
                done += 1
            }
        }
        logger.notice("re-encrypted sessions under the active key", metadata: ["count": .stringConvertible(done), "key": .string(ring.activeKeyID)])
    }
}
