import Foundation
import GatehouseCore
import GatehouseRelay
import GatehouseSessions
import GatehouseUpstreams
import Hummingbird
import Logging
import NIOCore

extension AuthorizationServer {
    /// `POST /oauth/revoke` (RFC 7009): ends the session of a Gatehouse token, or revokes an
    /// upstream token at the upstream (passthrough). 200 whether or not the token was known
    /// (§2.2), so the answer says nothing about which tokens exist.
    func revoke(_ request: Request) async -> Response {
        if let refusal = Self.refusingNonFormBody(request) { return refusal }
        var request = request
        let form: FormParameters
        do {
            let body = try await request.collectBody(upTo: configuration.server.maximumBodyBytes)
            form = try FormParameters(parsing: body.readableBytesView, recognizing: ["token", "token_type_hint", "client_id"])
        } catch let error as FormError {
            return .oauthError(.invalidRequest(error.description))
        } catch {
            return .problem(.payloadTooLarge(limit: configuration.server.maximumBodyBytes), for: request)
        }
        guard let token = form["token"] else { return .oauthError(.invalidRequest("token is required")) }
        guard let clientID = form["client_id"], let client = configuration.appClient(for: clientID) else {
            return .oauthError(.invalidClient("no app is registered with this client_id"))
        }
        if let sealed = sessions, let minter = upstreams[client.upstream]?.minter {
            // A minted refresh token ends its session; minted access tokens are JWTs that
            // nothing stores, valid until they expire (the kind's page in docs/ says so).
            let record: RefreshTokenRecord?
            let session: SessionRecord?
            do {
                record = try await sealed.services.store.refreshToken(hash: minter.refreshTokenHash(token))
                session = try await record.asyncFlatMap { try await sealed.services.store.session(id: $0.sessionID) }
            } catch {
                return .oauthError(.serverError("Gatehouse cannot reach its store right now"))
            }
            if let refused = await end(session, revokedBy: client, sessions: sealed) { return refused }
        } else if SessionServices.isGatehouseToken(token) {
            // Gatehouse's own token: never sent to an upstream, whatever happens.
            guard let sealed = sessions else { return Self.revoked() }
            let session: SessionRecord?
            do {
                session = try await sessionOf(token, sessions: sealed.services)
            } catch {
                // Never a 200 for a sign-out the store did not record: the app asks again.
                return .oauthError(.serverError("Gatehouse cannot reach its store right now"))
            }
            if let refused = await end(session, revokedBy: client, sessions: sealed) { return refused }
        } else if let upstream = upstreams[client.upstream] {
            // RFC 7009 §2.1: a token handed to another app is not this app's to revoke.
            let owner: String?
            do {
                owner = try await passthrough.owner(of: token)
            } catch {
                return .oauthError(.serverError("Gatehouse cannot reach its store right now"))
            }
            guard owner == nil || owner == client.clientID else {
                logger.notice("revocation of another app's token ignored", metadata: ["client_id": .string(clientID)])
                return Self.revoked()
            }
            let hint = form["token_type_hint"] == "access_token" ? "access_token" : "refresh_token"
            await upstream.revoke(token, hint: hint)
            audit.record(.revoke, clientID: clientID, subject: nil, reason: "upstream_" + hint)
            // After the upstream has revoked it, so a lookup racing the revocation is not cached as live.
            let key = TokenKey(token: token, upstream: client.upstream)
            identityCache?.invalidate(key: key)
            // Only the announcement tells the other instances (nothing in the store says this
            // token is revoked): without it, the app is asked to try again.
            do {
                try await store.announceRevocation(RevocationMessage.identity(key).text)
            } catch {
                return .oauthError(.serverError("Gatehouse cannot reach its store right now"))
            }
        }
        return Self.revoked()
    }

    private static func revoked() -> Response {
        var response = Response(status: .ok)
        response.headers[.cacheControl] = "no-store"
        return response
    }

    /// Ends `session` when it is `client`'s and not expired (logged and audited when it was live);
    /// a store failure is the answer, else `nil` (RFC 7009 §2.2: revoking what is not there, or
    /// not yours, is a success).
    ///
    /// A session already revoked is ended again: a sign-out answered 503 after its first step
    /// committed is retried by the app, and the steps after it (this instance's view, the other
    /// instances, the upstream's tokens) must still run. Each is harmless run twice.
    private func end(_ session: SessionRecord?, revokedBy client: AppClient, sessions: SealedSessions) async -> Response? {
        guard let session, session.clientID == client.clientID, session.expiresAt > now() else { return nil }
        do {
            try await sessions.end(session)
        } catch {
            return .oauthError(.serverError("Gatehouse cannot reach its store right now"))
        }
        if session.revokedAt == nil {
            logger.info("session revoked by the app", metadata: ["client_id": .string(client.clientID)])
            audit.record(.revoke, clientID: client.clientID, subject: session.subject, reason: "session_ended")
        }
        return nil
    }

    /// The session `token` belongs to, `nil` when none; throws when the store cannot tell.
    private func sessionOf(_ token: String, sessions: SessionServices) async throws -> SessionRecord? {
        let hash = SecureToken.hash(token)
        if SessionServices.isAccessToken(token) {
            return try await sessions.store.session(forAccessTokenHash: hash, now: now())?.session
        }
        guard let record = try await sessions.store.refreshToken(hash: hash) else { return nil }
        return try await sessions.store.session(id: record.sessionID)
    }
}
