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
struct DPoPEnforcement: Sendable {
    static let header = HTTPField.Name("DPoP")!
    static let nonceHeader = HTTPField.Name("DPoP-Nonce")!

    let settings: DPoPSettings
    /// `server.public_base_url`: a proof's `htu` is it plus the endpoint's path.
    let issuer: String
    let store: any SingleUseStore
    let now: @Sendable () -> Date
    /// Proof ids seen lately (RFC 9449 §11.1); the store keeps them for the other instances.
    let replays: DPoPReplayCache
    /// Server nonces, the same on every instance sharing the session key ring.
    let nonces: DPoPNonces

    init(configuration: GatehouseConfiguration, store: any SingleUseStore, now: @escaping @Sendable () -> Date,
         previous: DPoPEnforcement?) {
        settings = configuration.dpop
        issuer = configuration.server.publicBaseURL
        self.store = store
        self.now = now
        replays = previous?.replays ?? DPoPReplayCache(maximumEntries: configuration.dpop.replayCacheEntries)
        let nonceKey = configuration.sessions?.keyRing.derivedSecrets(purpose: "gatehouse dpop-nonce v1").first
            .map { SymmetricKey(data: $0) } ?? SymmetricKey(size: .bits256)
        nonces = previous?.nonces ?? DPoPNonces(key: nonceKey, lifetime: settings.proofLifetime.inSeconds * 2)
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
            proof = try verify(values[0], of: request, url: issuer + endpoint, accessToken: nil)
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

    /// Spends a proof's `jti` (per key). The in-memory cache answers a replay to this instance
    /// without the store; every first use is then written to the store, on SQLite as on
    /// PostgreSQL, so that a proof used once is refused after a restart (the memory is gone) and
    /// by every other instance. A store that cannot be reached refuses the proof (503), never
    /// accepts it unrecorded.
    func spend(_ proof: VerifiedDPoPProof) async -> ProofUse {
        let lifetime = settings.proofLifetime.inSeconds
        // A proof is accepted while its iat is within the lifetime either way: remember its jti that long, and more.
        let until = proof.issuedAt.addingTimeInterval(lifetime + 1)
        let key = proof.thumbprint + ":" + proof.jti
        let now = self.now()
        guard replays.firstUse(key, until: until, now: now) else { return .replayed }
        do {
            let stored = try await store.insertOnce(kind: "dpop_jti", keyHash: SecureToken.hash(key), value: Data(),
                                                    expiresAt: max(until, now.addingTimeInterval(1)), now: now)
            return stored ? .fresh : .replayed
        } catch {
            return .unavailable
        }
    }

    /// Why a request with a DPoP-bound token (`ghd_…`) is refused, or `nil` when its proof is good:
    /// `Authorization: DPoP`, one proof for this method and URI, the token's hash (`ath`), the key the
    /// session is bound to, a fresh `jti`, and the server nonce when required.
    func refusingBoundToken(_ request: Request, token: String, scheme: RelayAdmission.Scheme, boundThumbprint: String?) async -> Response? {
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
            proof = try verify(values[0], of: request, url: issuer + request.uri.path, accessToken: token)
        } catch {
            if error.useNonce {
                return refusal(request, error: "use_dpop_nonce", detail: "The DPoP proof must carry the nonce of the DPoP-Nonce header.")
            }
            return refusal(request, error: "invalid_dpop_proof", detail: "The DPoP proof is not valid: \(error.description).")
        }
        guard proof.thumbprint == boundThumbprint else {
            return refusal(request, error: "invalid_dpop_proof", detail: "The DPoP proof is not by the key the access token is bound to.")
        }
        switch await spend(proof) {
        case .fresh: return nil
        case .replayed: return refusal(request, error: "invalid_dpop_proof", detail: "The DPoP proof was used before (its jti).")
        case .unavailable: return .unavailable(.identityUnavailable(), for: request, retryAfter: 1)
        }
    }

    /// A proof checked as every proof here is: for this method and URL (and access token, when one
    /// is bound), within `dpop.proof_lifetime`, with the server nonce when `dpop.require_nonce`.
    private func verify(_ proof: String, of request: Request, url: String, accessToken: String?) throws(DPoPProofError) -> VerifiedDPoPProof {
        try DPoPProof.verify(proof, method: request.method.rawValue, url: url, accessToken: accessToken, now: now(),
                             lifetime: settings.proofLifetime.inSeconds, nonces: settings.requireNonce ? nonces : nil)
    }

    /// 401 with `WWW-Authenticate: DPoP` (RFC 9449 §7.1), a fresh nonce, and a problem body.
    func refusal(_ request: Request, error: String, detail: String) -> Response {
        var response = Response.problem(.invalidToken(detail), for: request)
        response.headers[.wwwAuthenticate] =
            #"DPoP error="\#(error)", error_description="\#(detail)", algs="\#(DPoPProof.algorithms.joined(separator: " "))""#
        response.headers[Self.nonceHeader] = nonces.current(now: now())
        return response
    }
}
