import Crypto
import Foundation
import GatehouseCore
import GatehouseSessions
import GatehouseUpstreams
import Logging

/// The pair Gatehouse mints for a `central` upstream (seed 002 §4), as both faces render it.
struct CentralPair: Codable {
    let accessToken: String
    /// Milliseconds since the epoch, as the seed's contract counts.
    let accessTokenExpiresAt: Int64
    let refreshToken: String
    let refreshTokenExpiresAt: Int64
    let user: CentralUser
    /// Whether this was the person's first sign-in through Gatehouse (the seed's `isNewUser`).
    var isNewUser = false

    /// RFC 6749 §5.1, for `/oauth/token`.
    func oauthBody(now: Date) -> Data {
        struct Body: Encodable {
            let access_token: String
            let token_type: String
            let expires_in: Int
            let refresh_token: String
        }
        let seconds = max(0, Int((Double(accessTokenExpiresAt) / 1000 - now.timeIntervalSince1970).rounded(.down)))
        return JSONCoding.encode(Body(access_token: accessToken, token_type: "Bearer", expires_in: seconds, refresh_token: refreshToken))
    }
}

extension Gatehouse {
    /// The `central` profile of an upstream, if it is one.
    func centralUpstream(_ name: String) -> CentralUpstream? {
        upstreams[name] as? CentralUpstream
    }

    /// The store's key for a central refresh token: its lowercase hex SHA-256 (seed 002 §4).
    static func centralRefreshHash(_ token: String) -> String {
        CentralRequestSigner.hexSHA256(Data(token.utf8))
    }

    /// 128 URL-safe characters: 96 random bytes as base64url.
    static func centralRefreshToken() -> String {
        var generator = SystemRandomNumberGenerator()
        var bytes: [UInt8] = []
        bytes.reserveCapacity(96)
        for _ in 0..<12 { withUnsafeBytes(of: generator.next() as UInt64) { bytes.append(contentsOf: $0) } }
        return Base64URL.encode(bytes)
    }

    /// Starts a session for a person the central provider (or Apple, through it) vouched for:
    /// the user is sealed in the session store, the app gets Gatehouse's JWT and refresh token.
    func beginCentralSession(user: CentralUser, clientID: String, upstream: CentralUpstream) async throws(OAuthError) -> CentralPair {
        guard let sessions else { throw .serverError("sealed sessions are not configured") }
        let now = self.now()
        let sessionID = SecureToken.generate()
        let isNewUser: Bool
        do {
            isNewUser = try await !sessions.store.sessions(subject: user.userId).contains { $0.upstream == upstream.settings.name }
            let (keyID, sealed) = try sessions.settings.keyRing.seal(user.json, associatedData: sessionID)
            try await sessions.store.insertSession(SessionRecord(
                id: sessionID, clientID: clientID, upstream: upstream.settings.name, subject: user.userId, keyID: keyID, sealedTokens: sealed,
                upstreamExpiresAt: nil, createdAt: now, expiresAt: now.addingTimeInterval(upstream.central.refreshTokenLifetime.inSeconds)))
        } catch {
            throw .serverError("Gatehouse could not record the session")
        }
        var pair = try await mintCentralPair(user: user, sessionID: sessionID, sessionExpiresAt: now.addingTimeInterval(
            upstream.central.refreshTokenLifetime.inSeconds), upstream: upstream, sessions: sessions, now: now)
        pair.isNewUser = isNewUser
        audit.record(.sign_in, clientID: clientID, subject: user.userId, metadata: [
            "upstream": .string(upstream.settings.name), "provider": .string(user.provider),
        ])
        logger.info("central session begun", metadata: ["client_id": .string(clientID), "upstream": .string(upstream.settings.name)])
        return pair
    }

    /// A new access token for a session, with a new refresh token that never outlives the session,
    /// or with the one in `kept` (`refresh_rotation: after_80_percent`, before 80 % of its life).
    private func mintCentralPair(user: CentralUser, sessionID: String, sessionExpiresAt: Date, upstream: CentralUpstream,
                                 sessions: SessionServices, now: Date, kept: (token: String, expiresAt: Date)? = nil)
        async throws(OAuthError) -> CentralPair
    {
        let accessExpiresAt = now.addingTimeInterval(upstream.central.accessTokenLifetime.inSeconds)
        let refreshToken = kept?.token ?? Self.centralRefreshToken()
        let refreshExpiresAt = kept?.expiresAt
            ?? min(sessionExpiresAt, now.addingTimeInterval(upstream.central.refreshTokenLifetime.inSeconds))
        let accessToken: String
        do {
            accessToken = try upstream.central.tokenKeys.accessToken(for: user, issuedAt: now, expiresAt: accessExpiresAt)
            if kept == nil {
                try await sessions.store.insertRefreshToken(hash: Self.centralRefreshHash(refreshToken), sessionID: sessionID,
                                                            expiresAt: refreshExpiresAt)
            }
        } catch {
            throw .serverError("Gatehouse could not record the tokens")
        }
        return CentralPair(accessToken: accessToken, accessTokenExpiresAt: Self.milliseconds(accessExpiresAt), refreshToken: refreshToken,
                           refreshTokenExpiresAt: Self.milliseconds(refreshExpiresAt), user: user)
    }

    /// A central refresh token swapped (`/auth/refresh`, or `/oauth/token` for a central app):
    /// rotated on every use with the grace window and family revocation of sealed sessions, or, with
    /// `refresh_rotation: after_80_percent`, kept until 80 % of its lifetime has passed (the seed's rule).
    func rotateCentralRefreshToken(_ refreshToken: String, clientID: String, upstream: CentralUpstream) async throws(OAuthError) -> CentralPair {
        guard let sessions, refreshToken.utf8.count == 128 else { throw .invalidGrant("the refresh token is invalid, expired or revoked") }
        let central = upstream.central
        let body = try await rotateFamily(refreshToken: refreshToken, hash: Self.centralRefreshHash(refreshToken), clientID: clientID,
                                          sessions: sessions) { session, record, now throws(OAuthError) in
            guard session.upstream == upstream.settings.name,
                  let opened = try? sessions.settings.keyRing.open(session.sealedTokens, keyID: session.keyID, associatedData: session.id),
                  let user = try? JSONDecoder().decode(CentralUser.self, from: opened) else {
                throw .invalidGrant("the refresh token is invalid, expired or revoked")
            }
            let remaining = record.expiresAt.timeIntervalSince(now) / central.refreshTokenLifetime.inSeconds
            let keeps = central.rotation == .after80Percent && remaining >= 0.2
            let pair = try await mintCentralPair(user: user, sessionID: session.id, sessionExpiresAt: session.expiresAt, upstream: upstream,
                                                 sessions: sessions, now: now, kept: keeps ? (refreshToken, record.expiresAt) : nil)
            return RotationSuccessor(body: JSONCoding.encode(pair), accessHash: nil, refreshHash: Self.centralRefreshHash(pair.refreshToken),
                                     replacesToken: !keeps)
        }
        guard let pair = try? JSONDecoder().decode(CentralPair.self, from: body) else {
            throw .invalidGrant("the refresh token is invalid, expired or revoked")
        }
        return pair
    }

    static func milliseconds(_ date: Date) -> Int64 {
        Int64((date.timeIntervalSince1970 * 1000).rounded(.down))
    }
}
