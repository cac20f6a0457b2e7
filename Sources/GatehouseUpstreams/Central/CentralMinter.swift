import Crypto
public import Foundation
public import GatehouseCore
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

/// The app's tokens for a `central` upstream: Gatehouse's RS256 JWT and a 128-character refresh
/// token, in a sealed session holding the central user (both faces: `/oauth/token` and `/auth/*`).
public struct CentralMinter: TokenMinter {
    let upstream: String
    let central: CentralSettings

    public func signedIn(userinfo: Data?, clientID: String, sessions: any MintedSessions) async throws(OAuthError) -> Data {
        // The sign-in proved who it is, nothing more: the user is the profile's verified answer.
        guard let userinfo, let user = try? JSONDecoder().decode(CentralUser.self, from: userinfo) else {
            throw .serverError("the sign-in carries no verified user")
        }
        let pair = try await beginSession(user: user, clientID: clientID, sessions: sessions)
        return pair.oauthBody(now: sessions.now)
    }

    public func refresh(_ refreshToken: String, clientID: String, sessions: any MintedSessions) async throws(OAuthError) -> Data {
        try await rotate(refreshToken, clientID: clientID, sessions: sessions).oauthBody(now: sessions.now)
    }

    public func refreshTokenHash(_ token: String) -> String { Self.refreshHash(token) }

    public var publicKeys: [[String: String]] { central.tokenKeys.jwks }

    /// The store's key for a central refresh token: its lowercase hex SHA-256 (seed 002 §4).
    static func refreshHash(_ token: String) -> String {
        CentralRequestSigner.hexSHA256(Data(token.utf8))
    }

    /// 128 URL-safe characters: 96 random bytes as base64url.
    static func newRefreshToken() -> String {
        var generator = SystemRandomNumberGenerator()
        var bytes: [UInt8] = []
        bytes.reserveCapacity(96)
        for _ in 0..<12 { withUnsafeBytes(of: generator.next() as UInt64) { bytes.append(contentsOf: $0) } }
        return Base64URL.encode(bytes)
    }

    /// Starts a session for a person the central provider (or Apple, through it) vouched for:
    /// the user is sealed in the session store, the app gets Gatehouse's JWT and refresh token.
    func beginSession(user: CentralUser, clientID: String, sessions: any MintedSessions) async throws(OAuthError) -> CentralPair {
        let now = sessions.now
        let expiresAt = now.addingTimeInterval(central.refreshTokenLifetime.inSeconds)
        let sessionID: String
        let isNewUser: Bool
        do {
            isNewUser = try await !sessions.hasSession(subject: user.userId, upstream: upstream)
            sessionID = try await sessions.begin(subject: user.userId, userinfo: user.json, clientID: clientID, upstream: upstream,
                                                 createdAt: now, expiresAt: expiresAt)
        } catch {
            throw .serverError("Gatehouse could not record the session")
        }
        var pair = try await mintPair(user: user, sessionID: sessionID, sessionExpiresAt: expiresAt, sessions: sessions, now: now)
        pair.isNewUser = isNewUser
        sessions.audit.record(.sign_in, clientID: clientID, subject: user.userId, metadata: [
            "upstream": .string(upstream), "provider": .string(user.provider),
        ])
        sessions.logger.info("central session begun", metadata: ["client_id": .string(clientID), "upstream": .string(upstream)])
        return pair
    }

    /// A new access token for a session, with a new refresh token that never outlives the session,
    /// or with the one in `kept` (`refresh_rotation: after_80_percent`, before 80 % of its life).
    private func mintPair(user: CentralUser, sessionID: String, sessionExpiresAt: Date, sessions: any MintedSessions, now: Date,
                          kept: (token: String, expiresAt: Date)? = nil) async throws(OAuthError) -> CentralPair
    {
        let accessExpiresAt = now.addingTimeInterval(central.accessTokenLifetime.inSeconds)
        let refreshToken = kept?.token ?? Self.newRefreshToken()
        let refreshExpiresAt = kept?.expiresAt ?? min(sessionExpiresAt, now.addingTimeInterval(central.refreshTokenLifetime.inSeconds))
        let accessToken: String
        do {
            accessToken = try central.tokenKeys.accessToken(for: user, issuedAt: now, expiresAt: accessExpiresAt)
            if kept == nil {
                try await sessions.recordRefreshToken(hash: Self.refreshHash(refreshToken), sessionID: sessionID, expiresAt: refreshExpiresAt)
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
    func rotate(_ refreshToken: String, clientID: String, sessions: any MintedSessions) async throws(OAuthError) -> CentralPair {
        guard refreshToken.utf8.count == 128 else { throw .invalidGrant("the refresh token is invalid, expired or revoked") }
        let central = self.central
        let body = try await sessions.rotate(refreshToken: refreshToken, hash: Self.refreshHash(refreshToken), clientID: clientID,
                                             upstream: upstream) { rotation throws(OAuthError) in
            guard let user = try? JSONDecoder().decode(CentralUser.self, from: rotation.userinfo) else {
                throw .invalidGrant("the refresh token is invalid, expired or revoked")
            }
            let remaining = rotation.refreshTokenExpiresAt.timeIntervalSince(rotation.now) / central.refreshTokenLifetime.inSeconds
            let keeps = central.rotation == .after80Percent && remaining >= 0.2
            let pair = try await mintPair(user: user, sessionID: rotation.sessionID, sessionExpiresAt: rotation.sessionExpiresAt,
                                          sessions: sessions, now: rotation.now,
                                          kept: keeps ? (refreshToken, rotation.refreshTokenExpiresAt) : nil)
            return MintedSuccessor(body: JSONCoding.encode(pair), refreshHash: Self.refreshHash(pair.refreshToken), replacesToken: !keeps)
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
