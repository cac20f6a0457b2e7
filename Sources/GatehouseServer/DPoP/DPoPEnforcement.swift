import Crypto
import Foundation
import GatehouseCore
import GatehouseRelay
import HTTPTypes
import Hummingbird

/// DPoP (RFC 9449), the one place it is enforced: the proofs of requests to Gatehouse's own
/// OAuth endpoints (token, registration, attestation), the proofs that come with bound access
/// tokens (relay, userinfo, session codes), and the refusals with their nonce. It owns the replay
/// cache of proof ids and the server nonces, both of which carry over a reload.
///
/// How a proof id is spent (`dpop.replay_protection`):
/// - `store`: in memory (a replay to this process is refused at once), then written to the store
///   and found new there before the request goes on: refused after a restart and by every other
///   instance, on any deployment.
/// - `instance_nonce`: every proof carries a nonce of this process (`DPoPNonces.instanceBound`),
///   of the current epoch or the one before; the ids spent under those epochs are all in memory
///   (`EpochReplaySet`), which answers alone. Another instance, or this one after a restart, never
///   accepts the nonce (`use_dpop_nonce`), so the proof cannot be used there either. Only when
///   memory overflowed does a proof go to the store as in `store`.
struct DPoPEnforcement: Sendable {
    static let header = HTTPField.Name("DPoP")!
    static let nonceHeader = HTTPField.Name("DPoP-Nonce")!

    let settings: DPoPSettings
    /// `server.public_base_url`: a proof's `htu` is it plus the endpoint's path.
    let issuer: String
    let now: @Sendable () -> Date
    /// Proof ids seen lately (RFC 9449 §11.1); the store keeps them for the other instances.
    let replays: DPoPReplayCache
    /// Server nonces: the same on every instance sharing the session key ring, or this process's
    /// own (`instance_nonce`).
    let nonces: DPoPNonces
    /// `instance_nonce`: the proof ids spent under each live nonce epoch.
    let epochs: EpochReplaySet?
    /// Writes the proof ids to the store, many in one statement under load.
    let proofIDs: SingleUseGroupCommit

    /// What outlives a configuration (`GatehouseRuntime`): the replay cache, the proof-id writer
    /// and the nonces, all made once at start from settings a reload never changes.
    struct State: Sendable {
        let replays: DPoPReplayCache
        let proofIDs: SingleUseGroupCommit
        let nonces: DPoPNonces
        let epochs: EpochReplaySet?

        init(configuration: GatehouseConfiguration, store: any SingleUseStore, now: @escaping @Sendable () -> Date) {
            let settings = configuration.dpop
            replays = DPoPReplayCache(maximumEntries: settings.replayCacheEntries)
            proofIDs = SingleUseGroupCommit(store: store, kind: "dpop_jti", now: now)
            switch settings.replayProtection {
            case .store:
                let nonceKey = configuration.sessions?.keyRing.derivedSecrets(purpose: "gatehouse dpop-nonce v1").first
                    .map { SymmetricKey(data: $0) } ?? SymmetricKey(size: .bits256)
                nonces = DPoPNonces(key: nonceKey, lifetime: settings.proofLifetime.inSeconds * 2)
                epochs = nil
            case .instanceNonce:
                nonces = .instanceBound(epoch: settings.nonceEpoch.inSeconds)
                epochs = EpochReplaySet(maximumEntries: settings.replayCacheEntries)
            }
        }
    }

    init(configuration: GatehouseConfiguration, state: State, now: @escaping @Sendable () -> Date) {
        settings = configuration.dpop
        issuer = configuration.server.publicBaseURL
        self.now = now
        replays = state.replays
        proofIDs = state.proofIDs
        nonces = state.nonces
        epochs = state.epochs
    }

    /// The verified DPoP proof of a request to one of Gatehouse's own OAuth endpoints (`endpoint`:
    /// its path; the proof's `htu` is `server.public_base_url` + it); `nil` when it carries none.
    /// The proof's `jti` is spent here: in memory, then in the store for the other instances.
    func endpointProof(_ request: Request, endpoint: String) async throws(OAuthError) -> VerifiedDPoPProof? {
        let values = request.headers[values: Self.header]
        guard !values.isEmpty else { return nil }
        guard values.count == 1 else { throw .invalidDPoPProof("a request carries at most one DPoP header") }
        let proof: VerifiedDPoPProof
        do {
            proof = try verify(values[0], method: request.method.rawValue, url: issuer + endpoint, accessToken: nil)
        } catch {
            if error.useNonce { throw .useDPoPNonce(nonce: self.nonces.current(now: now())) }
            throw .invalidDPoPProof(error.description)
        }
        switch await spend(proof) {
        case .fresh: return proof
        case .replayed: throw .invalidDPoPProof("the DPoP proof was used before (its jti)")
        case .unavailable: throw .serverError("Gatehouse cannot reach its store right now")
        }
    }

    enum ProofUse { case fresh, replayed, unavailable }

    /// A proof's first use, seen in memory, still to be written to the store (`record`).
    struct ProofSpend: Sendable {
        let keyHash: String
        let expiresAt: Date
    }

    /// Spends a proof's `jti` (per key). The in-memory cache answers a replay to this instance
    /// without the store. With `store`, every first use is then written to the store, on SQLite
    /// as on PostgreSQL, so that a proof used once is refused after a restart (the memory is
    /// gone) and by every other instance; with `instance_nonce`, the nonce already keeps the
    /// proof from every other instance and life, and memory answers alone. A store that cannot be
    /// reached refuses the proof (503), never accepts it unrecorded.
    func spend(_ proof: VerifiedDPoPProof) async -> ProofUse {
        switch remember(proof) {
        case .replayed: .replayed
        case .spent: .fresh
        case .toRecord(let spend): await record(spend)
        }
    }

    /// Whether this instance has spent `proof`'s `jti` (in memory; nothing is changed).
    func hasSeen(_ proof: VerifiedDPoPProof) -> Bool {
        if let epochs, let epoch = proof.nonceEpoch {
            return epochs.isRemembered(Self.replayKey(proof), epoch: epoch)
        }
        return replays.isRemembered(Self.replayKey(proof), now: now())
    }

    private static func replayKey(_ proof: VerifiedDPoPProof) -> String {
        proof.thumbprint + ":" + proof.jti
    }

    /// What memory says of a proof's first use (`remember`).
    enum Remembered {
        /// This instance has seen the proof id.
        case replayed
        /// New, and memory is complete for its nonce epoch (`instance_nonce`): nothing to write.
        case spent
        /// New to memory: the store must write it, and find it new (`record`).
        case toRecord(ProofSpend)
    }

    /// The in-memory half of `spend`, synchronous (the relay's fast path calls it on the event loop).
    func remember(_ proof: VerifiedDPoPProof) -> Remembered {
        let lifetime = settings.proofLifetime.inSeconds
        // A proof is accepted while its iat is within the lifetime either way: remember its jti that long, and more.
        let until = proof.issuedAt.addingTimeInterval(lifetime + 1)
        let key = Self.replayKey(proof)
        let now = self.now()
        let spend = { ProofSpend(keyHash: SecureToken.hash(key), expiresAt: max(until, now.addingTimeInterval(1))) }
        if let epochs, let epoch = proof.nonceEpoch {
            switch epochs.firstUse(key, epoch: epoch, current: nonces.epoch(at: now)) {
            case .fresh: return .spent
            // Its nonce died between the check and now: refused (rare: the instant an epoch ends).
            case .replayed, .expired: return .replayed
            case .unknown: return .toRecord(spend())
            }
        }
        guard replays.firstUse(key, until: until, now: now) else { return .replayed }
        return .toRecord(spend())
    }

    /// The nonce a response to a request with a DPoP proof announces (RFC 9449 §8.2: a new nonce
    /// may come with any answer), when nonces are required; `nil` otherwise. The relay's fast
    /// path takes only proofs of the current epoch, so an app whose nonce has aged gets the
    /// next one from the general path before its nonce runs out.
    func announcedNonce(for request: Request) -> String? {
        guard settings.noncesRequired, request.headers[Self.header] != nil else { return nil }
        return nonces.current(now: now())
    }

    /// The store's half of `spend`: `.fresh` only once the proof id is written and was new
    /// (proof ids spent at the same time share one statement: `SingleUseGroupCommit`).
    func record(_ spend: ProofSpend) async -> ProofUse {
        do {
            return try await proofIDs.insertOnce(keyHash: spend.keyHash, expiresAt: spend.expiresAt) ? .fresh : .replayed
        } catch {
            return .unavailable
        }
    }

    /// The proof of a request with a DPoP-bound token, checked on the relay's fast path (no
    /// await: `DPoPProof.verify` and the key binding; the `jti` is left to `remember` and
    /// `record`): `nil` whenever anything is off, and the general path then answers with its
    /// precise refusal (`refusingBoundToken`).
    func fastPathProof(_ values: [String], method: String, path: String, token: String, boundThumbprint: String?) -> VerifiedDPoPProof? {
        guard values.count == 1, let boundThumbprint,
              let proof = try? verify(values[0], method: method, url: issuer + path, accessToken: token),
              proof.thumbprint == boundThumbprint else { return nil }
        // A nonce of the epoch before: the general path relays it, with the current nonce.
        if let epoch = proof.nonceEpoch, epoch != nonces.epoch(at: now()) { return nil }
        return proof
    }

    /// Why a request with a DPoP-bound token (`ghd_…`) is refused, or `nil` when its proof is good:
    /// `Authorization: DPoP`, one proof for this method and URI, the token's hash (`ath`), the key the
    /// session is bound to, a fresh `jti`, and the server nonce when required.
    /// - Parameter htu: the URL the app called (no query); Gatehouse's own URL for the request when `nil`.
    func refusingBoundToken(_ request: Request, token: String, scheme: RelayAdmission.Scheme, boundThumbprint: String?,
                            htu: String? = nil) async -> Response? {
        guard scheme == .dpop else {
            return refusal(request, error: "invalid_token", detail: "The access token is bound to a DPoP key: send it as Authorization: DPoP with a proof.")
        }
        guard let boundThumbprint else {
            return refusal(request, error: "invalid_token", detail: "The access token is invalid, expired or revoked.")
        }
        let values = request.headers[values: Self.header]
        guard values.count == 1 else {
            return refusal(request, error: "invalid_dpop_proof", detail: "The request must carry exactly one DPoP proof.")
        }
        let proof: VerifiedDPoPProof
        do {
            proof = try verify(values[0], method: request.method.rawValue, url: htu ?? issuer + request.uri.path, accessToken: token)
        } catch {
            if error.useNonce {
                return refusal(request, error: "use_dpop_nonce", detail: "The DPoP proof must carry the nonce of the DPoP-Nonce header.")
            }
            return refusal(request, error: "invalid_dpop_proof", detail: "The DPoP proof is not valid: \(error.description).")
        }
        guard proof.thumbprint == boundThumbprint else {
            return refusal(request, error: "invalid_dpop_proof", detail: "The DPoP proof is not by the key the access token is bound to.")
        }
        return refusal(of: await spend(proof)).map { Self.response($0.problem, headers: $0.headers, for: request) }
    }

    /// How a request with a bound token is answered when its proof's `jti` is not fresh: a replay
    /// (401, the challenge), or a store that cannot say (503, `Retry-After: 1`); `nil` when fresh.
    /// Both relay paths answer with it (the fast path without Hummingbird).
    func refusal(of use: ProofUse) -> (problem: GatehouseProblem, headers: [(String, String)])? {
        switch use {
        case .fresh: nil
        case .replayed: (.invalidToken(Self.replayedDetail), challenge(error: "invalid_dpop_proof", detail: Self.replayedDetail))
        case .unavailable: (.identityUnavailable(), [("Retry-After", "1")])
        }
    }

    /// A proof checked as every proof here is: for this method and URL (and access token, when one
    /// is bound), within `dpop.proof_lifetime`, with the server nonce when nonces are required (`dpop.nonce`, `instance_nonce`).
    private func verify(_ proof: String, method: String, url: String, accessToken: String?) throws(DPoPProofError) -> VerifiedDPoPProof {
        try DPoPProof.verify(proof, method: method, url: url, accessToken: accessToken, now: now(),
                             lifetime: settings.proofLifetime.inSeconds, nonces: settings.noncesRequired ? nonces : nil)
    }

    private static let replayedDetail = "The DPoP proof was used before (its jti)."

    /// 401 with `WWW-Authenticate: DPoP` (RFC 9449 §7.1), a fresh nonce, and a problem body.
    func refusal(_ request: Request, error: String, detail: String) -> Response {
        Self.response(.invalidToken(detail), headers: challenge(error: error, detail: detail), for: request)
    }

    private static func response(_ problem: GatehouseProblem, headers: [(String, String)], for request: Request) -> Response {
        var response = Response.problem(problem, for: request)
        for (name, value) in headers { response.headers[HTTPField.Name(name)!] = value }
        return response
    }

    /// The headers of a refusal: `WWW-Authenticate: DPoP` with the error, and a fresh nonce.
    private func challenge(error: String, detail: String) -> [(String, String)] {
        [("WWW-Authenticate", #"DPoP error="\#(error)", error_description="\#(detail)", algs="\#(DPoPProof.algorithms.joined(separator: " "))""#),
         ("DPoP-Nonce", nonces.current(now: now()))]
    }
}
