import Foundation
import GatehouseCore
import GatehouseSessions
import GatehouseUpstreams
import HTTPTypes
import Hummingbird
import Logging

/// Sealed sessions as a minting kind sees them (`MintedSessions`): the session that holds the
/// person its upstream vouched for, and its refresh-token family, rotated as every sealed
/// session's is (`rotateFamily`).
struct GatehouseMintedSessions: MintedSessions {
    let feature: SealedSessions
    var sessions: SessionServices { feature.services }

    var now: Date { feature.now() }
    var audit: AuditLog { feature.audit }
    var logger: Logger { feature.logger }

    func hasSession(subject: String, upstream: String) async throws -> Bool {
        try await sessions.store.sessions(subject: subject).contains { $0.upstream == upstream }
    }

    func begin(subject: String, userinfo: Data, clientID: String, upstream: String, createdAt: Date, expiresAt: Date) async throws -> String {
        let sessionID = SecureToken.generate()
        let (keyID, sealed) = try sessions.settings.keyRing.seal(userinfo, associatedData: sessionID)
        try await sessions.store.insertSession(SessionRecord(
            id: sessionID, clientID: clientID, upstream: upstream, subject: subject, keyID: keyID, sealedTokens: sealed,
            upstreamExpiresAt: nil, createdAt: createdAt, expiresAt: expiresAt))
        return sessionID
    }

    func recordRefreshToken(hash: String, sessionID: String, expiresAt: Date) async throws {
        try await sessions.store.insertRefreshToken(hash: hash, sessionID: sessionID, expiresAt: expiresAt)
    }

    func rotate(refreshToken: String, hash: String, clientID: String, upstream: String,
                issue: (MintedRotation) async throws(OAuthError) -> MintedSuccessor) async throws(OAuthError) -> Data {
        let keyRing = sessions.settings.keyRing
        return try await feature.rotateFamily(refreshToken: refreshToken, hash: hash, clientID: clientID, sessions: sessions) {
            session, record, now throws(OAuthError) in
            guard session.upstream == upstream,
                  let userinfo = try? keyRing.open(session.sealedTokens, keyID: session.keyID, associatedData: session.id) else {
                throw .invalidGrant("the refresh token is invalid, expired or revoked")
            }
            let successor = try await issue(MintedRotation(sessionID: session.id, sessionExpiresAt: session.expiresAt, userinfo: userinfo,
                                                           refreshTokenExpiresAt: record.expiresAt, now: now))
            return SealedSessions.RotationSuccessor(body: successor.body, accessHash: nil, refreshHash: successor.refreshHash,
                                               replacesToken: successor.replacesToken)
        }
    }

    func insertOnce(kind: String, keyHash: String, expiresAt: Date) async throws -> Bool {
        try await feature.store.insertOnce(kind: kind, keyHash: keyHash, value: Data(), expiresAt: expiresAt, now: feature.now())
    }
}

extension SealedSessions {
    /// The sealed sessions a minting kind keeps its people in.
    var minted: GatehouseMintedSessions { GatehouseMintedSessions(feature: self) }

    /// `POST {path}` of a kind's own app face (`AppRoute`): the body read up to `server.max_body_bytes`,
    /// the client's address resolved as `rate_limits` does, the answer JSON and never cached.
    func appRoute(_ route: AppRoute, request: Request, peer: String?) async -> Response {
        let body = await boundedBody(request)
        let answer = await route.handle(AppRequest(
            contentType: request.headers[.contentType], body: body.map { Data($0.readableBytesView) },
            limit: configuration.server.maximumBodyBytes, clientAddress: limits.clientAddress(peer: peer, headers: request.headers)), minted)
        var response = Response.json(bytes: answer.json, status: .init(code: answer.status))
        for (name, value) in answer.headers {
            if let name = HTTPField.Name(name) { response.headers[name] = value }
        }
        return response
    }
}
