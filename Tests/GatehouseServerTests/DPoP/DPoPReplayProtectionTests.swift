import Crypto
import Foundation
import GatehouseCore
@testable import GatehouseServer
import Synchronization
import Testing

/// `dpop.replay_protection`: what each mode asks of the store, and what it refuses, with the
/// enforcement the relay, `/userinfo` and the OAuth endpoints all spend proofs through.
struct DPoPReplayProtectionTests {
    static let base = "https://gatehouse.example.com"
    static let url = base + "/api/orders"

    /// A store that counts what it is asked and can be made to fail.
    final class CountingStore: SingleUseStore, Sendable {
        let inserts = Mutex<Set<String>>([])
        let calls = Atomic<Int>(0)
        let failing: Bool

        init(failing: Bool = false) { self.failing = failing }

        struct Down: Error {}

        func insertOnce(kind: String, keyHash: String, value: Data, expiresAt: Date, now: Date) async throws -> Bool {
            calls.add(1, ordering: .relaxed)
            if failing { throw Down() }
            return inserts.withLock { $0.insert(kind + ":" + keyHash).inserted }
        }

        func consumeOnce(kind: String, keyHash: String, now: Date) async throws -> Data? { nil }
    }

    struct Signer {
        let key = P256.Signing.PrivateKey()

        func proof(jti: String = SecureToken.generate(), nonce: String?, iat: Date = Date()) -> String {
            let raw = key.publicKey.rawRepresentation
            let jwk = ["kty": "EC", "crv": "P-256", "x": Base64URL.encode(raw.prefix(32)), "y": Base64URL.encode(raw.suffix(32))]
            var claims: [String: Any] = ["htm": "GET", "htu": DPoPReplayProtectionTests.url, "iat": iat.timeIntervalSince1970.rounded(), "jti": jti]
            if let nonce { claims["nonce"] = nonce }
            let input = Base64URL.encode(try! JSONSerialization.data(withJSONObject: ["typ": "dpop+jwt", "alg": "ES256", "jwk": jwk]))
                + "." + Base64URL.encode(try! JSONSerialization.data(withJSONObject: claims))
            return input + "." + Base64URL.encode(try! key.signature(for: Data(input.utf8)).rawRepresentation)
        }
    }

    /// An enforcement as a process makes it at start (a new `State`: a restart makes another).
    static func enforcement(_ mode: DPoPSettings.ReplayProtection, store: any SingleUseStore, entries: Int = 100_000,
                            now: @escaping @Sendable () -> Date = Date.init) -> DPoPEnforcement {
        var configuration = GatehouseConfiguration(server: ServerSettings(publicBaseURL: base), store: StoreSettings(sqlitePath: ":memory:"),
                                                   upstreams: [:], clients: [:])
        configuration.dpop = DPoPSettings(replayCacheEntries: entries, replayProtection: mode)
        return DPoPEnforcement(configuration: configuration, state: DPoPEnforcement.State(configuration: configuration, store: store, now: now),
                               now: now)
    }

    static func verified(_ proof: String, by dpop: DPoPEnforcement, now: Date = Date()) throws(DPoPProofError) -> VerifiedDPoPProof {
        try DPoPProof.verify(proof, method: "GET", url: url, accessToken: nil, now: now, lifetime: 60,
                             nonces: dpop.settings.noncesRequired ? dpop.nonces : nil)
    }

    @Test func instanceNoncesSpendProofsInMemoryAloneAndRefuseAReplay() async throws {
        let store = CountingStore(failing: true)
        let dpop = Self.enforcement(.instanceNonce, store: store)
        let signer = Signer()
        let proof = try Self.verified(signer.proof(nonce: dpop.nonces.current(now: Date())), by: dpop)
        // A store that is down changes nothing: it is never asked.
        #expect(await dpop.spend(proof) == .fresh)
        #expect(await dpop.spend(proof) == .replayed)
        #expect(dpop.hasSeen(proof))
        #expect(store.calls.load(ordering: .relaxed) == 0)
        // The relay's fast path: memory's answer is final, nothing to write.
        let other = try Self.verified(signer.proof(nonce: dpop.nonces.current(now: Date())), by: dpop)
        guard case .spent = dpop.remember(other) else { Issue.record("a fresh proof under an instance nonce was not final"); return }
        guard case .replayed = dpop.remember(other) else { Issue.record("a replay passed the fast path's memory"); return }
    }

    @Test func theStoreModeWritesEveryFirstUseAndRefusesWhenTheStoreIsDown() async throws {
        let store = CountingStore()
        let dpop = Self.enforcement(.store, store: store)
        let proof = try Self.verified(Signer().proof(nonce: nil), by: dpop)
        #expect(await dpop.spend(proof) == .fresh)
        #expect(store.calls.load(ordering: .relaxed) == 1)
        // Another process on the same store (another instance, or a restart): refused by the store.
        #expect(await Self.enforcement(.store, store: store).spend(proof) == .replayed)
        let down = Self.enforcement(.store, store: CountingStore(failing: true))
        #expect(await down.spend(try Self.verified(Signer().proof(nonce: nil), by: down)) == .unavailable)
    }

    @Test func anotherInstanceOrARestartNeverAcceptsTheNonce() throws {
        let store = CountingStore()
        let first = Self.enforcement(.instanceNonce, store: store)
        let proof = Signer().proof(nonce: first.nonces.current(now: Date()))
        _ = try Self.verified(proof, by: first)
        // Another instance, or this one after a restart, has its own key: the proof asks for a nonce.
        let restarted = Self.enforcement(.instanceNonce, store: store)
        #expect(throws: DPoPProofError.self) { try Self.verified(proof, by: restarted) }
        do {
            _ = try Self.verified(proof, by: restarted)
        } catch {
            #expect(error.useNonce)
        }
        // A proof without a nonce, in this mode, too.
        do {
            _ = try Self.verified(Signer().proof(nonce: nil), by: first)
            Issue.record("a proof without a nonce passed under instance_nonce")
        } catch {
            #expect(error.useNonce)
        }
    }

    @Test func overflowingMemoryFallsBackToTheStoreWithTheSameGuarantee() async throws {
        let store = CountingStore()
        let dpop = Self.enforcement(.instanceNonce, store: store, entries: 1000)
        let signer = Signer()
        let nonce = dpop.nonces.current(now: Date())
        var proofs: [VerifiedDPoPProof] = []
        for _ in 0..<1002 { proofs.append(try Self.verified(signer.proof(nonce: nonce), by: dpop)) }
        for proof in proofs { #expect(await dpop.spend(proof) == .fresh) }
        // The two memory could not hold went to the store; every one is refused the second time.
        #expect(store.calls.load(ordering: .relaxed) == 2)
        for proof in proofs { #expect(await dpop.spend(proof) == .replayed) }
    }

    @Test func theFastPathLeavesAnAgedNonceToTheGeneralPath() throws {
        let clock = Mutex(Date(timeIntervalSince1970: 1_800_000_000))
        let dpop = Self.enforcement(.instanceNonce, store: CountingStore(), now: { clock.withLock { $0 } })
        let started = clock.withLock { $0 }
        let signer = Signer()
        let token = "ghd_token"
        func proof(_ nonce: String) -> String {
            var claims: [String: Any] = ["htm": "GET", "htu": Self.url, "iat": clock.withLock { $0 }.timeIntervalSince1970, "jti": SecureToken.generate(),
                                         "nonce": nonce, "ath": Base64URL.encode(SHA256.hash(data: Data(token.utf8)))]
            claims["nonce"] = nonce
            let raw = signer.key.publicKey.rawRepresentation
            let jwk = ["kty": "EC", "crv": "P-256", "x": Base64URL.encode(raw.prefix(32)), "y": Base64URL.encode(raw.suffix(32))]
            let input = Base64URL.encode(try! JSONSerialization.data(withJSONObject: ["typ": "dpop+jwt", "alg": "ES256", "jwk": jwk]))
                + "." + Base64URL.encode(try! JSONSerialization.data(withJSONObject: claims))
            return input + "." + Base64URL.encode(try! signer.key.signature(for: Data(input.utf8)).rawRepresentation)
        }
        let raw = signer.key.publicKey.rawRepresentation
        let thumbprint = JSONWebKey.thumbprint(of: ["kty": "EC", "crv": "P-256", "x": Base64URL.encode(raw.prefix(32)), "y": Base64URL.encode(raw.suffix(32))])
        let nonce = dpop.nonces.current(now: started)
        #expect(dpop.fastPathProof([proof(nonce)], method: "GET", path: "/api/orders", token: token, boundThumbprint: thumbprint) != nil)
        // One epoch later the nonce is still good, but the fast path declines: the general path
        // relays it and announces the current nonce.
        clock.withLock { $0 = dpop.nonces.end(of: dpop.nonces.epoch(at: started)) }
        #expect(dpop.fastPathProof([proof(nonce)], method: "GET", path: "/api/orders", token: token, boundThumbprint: thumbprint) == nil)
        #expect(dpop.fastPathProof([proof(dpop.nonces.current(now: clock.withLock { $0 }))], method: "GET", path: "/api/orders", token: token,
                                   boundThumbprint: thumbprint) != nil)
    }

    @Test func aProofSpentInMemoryIsNotFreshAgainOnceItsEpochsSetIsGone() async throws {
        let clock = Mutex(Date(timeIntervalSince1970: 1_800_000_000))
        let store = CountingStore()
        let dpop = Self.enforcement(.instanceNonce, store: store, now: { clock.withLock { $0 } })
        let nonces = dpop.nonces
        let start = nonces.end(of: nonces.epoch(at: clock.withLock { $0 }))
        // A nonce of epoch e, the proof first spent during e + 1 (its nonce still good).
        let nonce = nonces.current(now: start.addingTimeInterval(-1))
        clock.withLock { $0 = start.addingTimeInterval(1) }
        let proof = try Self.verified(Signer().proof(nonce: nonce, iat: start), by: dpop, now: start.addingTimeInterval(1))
        #expect(await dpop.spend(proof) == .fresh)
        // Replayed: checked just before e + 1 ends, spent once e + 2 began. The store never held
        // it (memory answered alone), so it must not be asked now.
        clock.withLock { $0 = nonces.end(of: nonces.epoch(at: start) ).addingTimeInterval(0.5) }
        #expect(await dpop.spend(proof) == .replayed)
        #expect(dpop.hasSeen(proof))
        #expect(store.calls.load(ordering: .relaxed) == 0)
    }
}
