import Foundation
import GatehouseCore
import GatehouseRelay
import GatehouseSessions
import GatehouseUpstreams
import Logging

/// Sealed sessions: the app holds Gatehouse's own tokens, the upstream's stay sealed in the
/// store (and the person a minting kind vouched for). Their token pairs, the rotation of their
/// refresh-token family, their end; `/userinfo`, session codes and web sessions; and the
/// sessions a minting kind keeps (`GatehouseMintedSessions`).
struct SealedSessions: GatehouseFeature {
    let configuration: GatehouseConfiguration
    let store: any GatehouseStore
    let upstreams: [String: any UpstreamProfile]
    let now: @Sendable () -> Date
    let logger: Logger
    let audit: AuditLog
    let limits: RateLimiters
    let dpop: DPoPEnforcement
    /// Gatehouse's key: the ID tokens of sealed apps of upstreams that prove who signed in.
    let signer: AssertionSigner?
    let services: SessionServices
    /// The relay's resolvers and cache, when routes are configured: a session's subject is looked
    /// up once, and an ended session's cached identity is dropped.
    let relay: RelayServices?
    /// App instances, when an app has them: a web session is a grant too.
    let instances: AppInstances?
}

extension SealedSessions {
    /// The pair Gatehouse hands the app of a sealed client.
    struct GatehousePair: Codable {
        let access_token: String
        let token_type: String
        let expires_in: Int
        let refresh_token: String
        let scope: String?
        /// Gatehouse's own ID token, for apps of upstreams that prove who signed in.
        var id_token: String? = nil
    }

    /// Starts a sealed session from a completed sign-in: the upstream tokens (and the verified
    /// userinfo) are sealed in the store and the app gets Gatehouse's own pair, plus Gatehouse's
    /// own ID token when the upstream proved who signed in.
    ///
    /// `dpopJKT`: the thumbprint of the app's DPoP key; the session's tokens are then bound to it
    /// (RFC 9449): a `ghd_` access token of type `DPoP`, and refreshes only with a proof by that key.
    func beginSession(client: AppClient, signIn: AuthorizationServer.SignIn, dpopJKT: String? = nil) async throws(OAuthError) -> Data {
        let sessions = services
        let tokens = try UpstreamTokenResponse(body: signIn.tokens)
        let sessionID = SecureToken.generate()
        let now = self.now()
        // Who signed in, as the upstream's validated ID token says: only profiles that validate
        // ID tokens (OpenID Connect kinds) give one; Gatehouse vouches for nothing else.
        let provesIdentity = configuration.upstreams[client.upstream].map(GatehouseApplication.issuesIDTokens) == true
        let subject = provesIdentity ? signIn.subject : nil
        let session: SessionRecord
        do {
            let document = try SessionServices.sessionDocument(tokens: signIn.tokens, userinfo: signIn.userinfo)
            let (keyID, sealed) = try sessions.settings.keyRing.seal(document, associatedData: sessionID)
            session = SessionRecord(
                id: sessionID, clientID: client.clientID, upstream: client.upstream, subject: subject, keyID: keyID, sealedTokens: sealed,
                upstreamExpiresAt: tokens.expiresIn.map { now.addingTimeInterval(Double($0)) }, createdAt: now,
                expiresAt: now.addingTimeInterval(sessions.settings.refreshTokenLifetime.inSeconds), dpopJKT: dpopJKT)
            try await sessions.store.insertSession(session)
        } catch {
            throw .serverError("Gatehouse could not record the session")
        }
        let scope = (try? JSONSerialization.jsonObject(with: signIn.tokens) as? [String: Any])?["scope"] as? String
        var pair = try await issuePair(sessionID: sessionID, scope: scope, bound: dpopJKT != nil, sessions: sessions)
        if let subject {
            guard let signer, let handle = try? Self.sessionHandle(for: sessionID, keyRing: sessions.settings.keyRing),
                  let idToken = try? await signer.idToken(subject: subject, audience: client.clientID, sessionHandle: handle,
                                                          nonce: signIn.appNonce, lifetime: sessions.settings.accessTokenLifetime) else {
                throw .serverError("Gatehouse could not sign the ID token")
            }
            pair.id_token = idToken
        } else {
            await recordSubject(of: session, upstreamAccessToken: tokens.accessToken.reveal(), sessions: sessions)
        }
        logger.info("sealed session begun", metadata: ["client_id": .string(client.clientID)])
        return JSONCoding.encode(pair)
    }

    private static let sessionHandlePurpose = "gatehouse id_token sid v1"

    /// The `sid` of Gatehouse's ID tokens: the session id sealed under the session key ring, so
    /// only Gatehouse can read which session an ID token names.
    static func sessionHandle(for sessionID: String, keyRing: KeyRing) throws -> String {
        let (keyID, sealed) = try keyRing.seal(Data(sessionID.utf8), associatedData: sessionHandlePurpose)
        return keyID + "." + Base64URL.encode(sealed)
    }

    /// The session id inside a `sid`; `nil` when it is not one Gatehouse sealed.
    static func sessionID(fromHandle handle: String, keyRing: KeyRing) -> String? {
        // Split at the last dot: key ids may hold dots, base64url never does.
        guard let dot = handle.lastIndex(of: "."), let sealed = Base64URL.decode(String(handle[handle.index(after: dot)...])),
              let opened = try? keyRing.open(sealed, keyID: String(handle[..<dot]), associatedData: sessionHandlePurpose) else { return nil }
        return String(decoding: opened, as: UTF8.self)
    }

    private func issuePair(sessionID: String, scope: String?, bound: Bool, sessions: SessionServices) async throws(OAuthError) -> GatehousePair {
        let pair = GatehousePair(
            access_token: (bound ? SessionServices.boundAccessPrefix : SessionServices.accessPrefix) + SecureToken.generate(),
            token_type: bound ? "DPoP" : "Bearer",
            expires_in: Int(sessions.settings.accessTokenLifetime.inSeconds),
            refresh_token: SessionServices.refreshPrefix + SecureToken.generate(), scope: scope)
        let now = self.now()
        do {
            try await sessions.store.insertAccessToken(hash: SecureToken.hash(pair.access_token), sessionID: sessionID,
                                                       expiresAt: now.addingTimeInterval(sessions.settings.accessTokenLifetime.inSeconds))
            try await sessions.store.insertRefreshToken(hash: SecureToken.hash(pair.refresh_token), sessionID: sessionID,
                                                        expiresAt: now.addingTimeInterval(sessions.settings.refreshTokenLifetime.inSeconds))
        } catch {
            throw .serverError("Gatehouse could not record the tokens")
        }
        return pair
    }

    /// Best effort: the session's subject, for `gatehouse sessions list --subject`.
    private func recordSubject(of session: SessionRecord, upstreamAccessToken: String, sessions: SessionServices) async {
        guard let relay, let resolver = relay.resolvers[session.upstream],
              let identity = configuration.upstreams[session.upstream]?.identity else { return }
        if case .active(let caller)? = try? await relay.cache.resolve(
            token: upstreamAccessToken, upstream: session.upstream, ttl: identity.cacheTTL, negativeTTL: identity.negativeTTL, resolver: resolver),
           let subject = caller.subject {
            try? await sessions.store.setSubject(subject, sessionID: session.id)
        }
    }

    /// `refresh_token` for a sealed client (RFC 9700 §4.14.2): rotate, replay within the grace
    /// window, or revoke the family on reuse.
    ///
    /// A session bound to a DPoP key (RFC 9449 §5: a public client's refresh tokens are bound
    /// too) rotates only for a proof by that key (`binding`), and its new pair is bound again.
    func rotateRefreshToken(_ refreshToken: String, client: AppClient, binding: String?) async throws(OAuthError) -> Data {
        let sessions = services
        guard refreshToken.hasPrefix(SessionServices.refreshPrefix) else {
            throw .invalidGrant("the refresh token is invalid, expired or revoked")
        }
        return try await rotateFamily(refreshToken: refreshToken, hash: SecureToken.hash(refreshToken), clientID: client.clientID,
                                      sessions: sessions) { session, _, _ throws(OAuthError) in
            if let bound = session.dpopJKT {
                guard let binding else { throw .invalidDPoPProof("the refresh token is bound to a DPoP key: send a proof by it") }
                guard binding == bound else { throw .invalidDPoPProof("the DPoP proof is not by the key the refresh token is bound to") }
            }
            let pair = try await issuePair(sessionID: session.id, scope: nil, bound: session.dpopJKT != nil, sessions: sessions)
            return RotationSuccessor(body: JSONCoding.encode(pair), accessHash: SecureToken.hash(pair.access_token),
                                     refreshHash: SecureToken.hash(pair.refresh_token))
        }
    }

    /// A rotation's new pair: the body the app gets (and a retry within the grace window gets
    /// again), and the hashes to drop should another request have rotated first.
    struct RotationSuccessor {
        let body: Data
        let accessHash: String?
        let refreshHash: String
        /// `false` when the presented refresh token stays valid (`refresh_rotation: after_80_percent`).
        var replacesToken = true
    }

    /// The refresh-token family as `RefreshRotation` decides it, for Gatehouse's own refresh tokens
    /// of any format: `issue` makes the successor pair of a live session.
    ///
    /// Counted once in `gatehouse_refreshes_total` (`performed`: rotated; `coalesced`: the pair
    /// of a rotation within the grace window; `reuse_detected`; `failed`), plus `family_revoked`
    /// when a reuse ends the session; audited (`refresh`, `reuse_detected`, `family_revoked`).
    func rotateFamily(refreshToken: String, hash: String, clientID: String, sessions: SessionServices,
                      issue: (SessionRecord, RefreshTokenRecord, Date) async throws(OAuthError) -> RotationSuccessor)
        async throws(OAuthError) -> Data
    {
        let purpose = "gatehouse refresh-successor v1"
        var counted = GatehouseMetrics.RefreshOutcome.failed
        defer { GatehouseMetrics.refresh(counted) }
        for _ in 0..<3 {
            let now = self.now()
            let record: RefreshTokenRecord?
            let session: SessionRecord?
            do {
                record = try await sessions.store.refreshToken(hash: hash)
                session = try await record.asyncFlatMap { try await sessions.store.session(id: $0.sessionID) }
            } catch {
                throw .serverError("Gatehouse cannot reach its store right now")
            }
            guard session?.clientID == clientID || session == nil else {
                throw .invalidGrant("the refresh token was issued to another app")
            }
            switch RefreshRotation.decide(record, session: session, now: now, grace: sessions.settings.refreshGrace) {
            case .refuse:
                throw .invalidGrant("the refresh token is invalid, expired or revoked")
            case .replay:
                guard let sealed = record?.successorSealed, let pair = try? TokenSeal.open(sealed, with: refreshToken, purpose: purpose) else {
                    throw .invalidGrant("the refresh token is invalid, expired or revoked")
                }
                counted = .coalesced
                audit.record(.refresh, clientID: clientID, subject: session?.subject, reason: "grace_replay")
                return pair
            case .revokeFamily:
                guard let session else { throw .invalidGrant("the refresh token is invalid, expired or revoked") }
                counted = .reuse_detected
                logger.warning("security event: a replaced refresh token was presented again; its session is revoked",
                               metadata: ["client_id": .string(clientID), "session": .string(String(SecureToken.hash(session.id).prefix(12)))])
                audit.record(.reuse_detected, clientID: clientID, subject: session.subject, reason: "refresh_token_after_grace")
                if (try? await end(session)) != nil {
                    GatehouseMetrics.refresh(.family_revoked)
                    audit.record(.family_revoked, clientID: clientID, subject: session.subject, reason: "refresh_token_reuse")
                }
                throw .invalidGrant("the refresh token was already used; the session has been ended")
            case .rotate:
                guard let session, let record else { throw .invalidGrant("the refresh token is invalid, expired or revoked") }
                let successor = try await issue(session, record, now)
                guard successor.replacesToken else {
                    counted = .performed
                    audit.record(.refresh, clientID: clientID, subject: session.subject)
                    return successor.body
                }
                do {
                    let sealed = try TokenSeal.seal(successor.body, with: refreshToken, purpose: purpose)
                    if try await sessions.store.markRefreshTokenReplaced(hash: hash, successorSealed: sealed, now: now) {
                        counted = .performed
                        audit.record(.refresh, clientID: clientID, subject: session.subject)
                        return successor.body
                    }
                    // Another request rotated it first: drop ours and answer theirs.
                    try await sessions.store.deleteTokens(accessHash: successor.accessHash ?? "", refreshHash: successor.refreshHash)
                } catch {
                    throw .serverError("Gatehouse cannot reach its store right now")
                }
            }
        }
        throw .serverError("the refresh token is being used concurrently; try again")
    }

    /// Ends a session everywhere (`SessionServices.end`); throws when the store cannot record it.
    func end(_ session: SessionRecord) async throws {
        try await services.end(session, upstreams: upstreams, identityCache: relay?.cache)
    }
}

extension Optional {
    func asyncFlatMap<U>(_ transform: (Wrapped) async throws -> U?) async rethrows -> U? {
        guard let self else { return nil }
        return try await transform(self)
    }
}
