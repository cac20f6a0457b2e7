import Foundation
import GatehouseCore
import GatehouseRelay
import GatehouseSessions
import GatehouseUpstreams
import Hummingbird
import Logging

extension AuthorizationServer {
    /// `GET /oauth/logout` (OpenID Connect RP-Initiated Logout 1.0): ends the app's session and
    /// sends the browser through the upstream's end-session endpoint (so its cookies expire),
    /// then back to the app's registered post-logout URI. Nothing unregistered is ever redirected to.
    func logout(_ request: Request) async -> Response {
        let parameters: FormParameters
        do {
            parameters = try FormParameters(parsing: Array((request.uri.query ?? "").utf8),
                                            recognizing: ["client_id", "post_logout_redirect_uri", "state", "id_token_hint"])
        } catch {
            return .problem(.badRequest("The logout request is malformed: \(error.description)."), for: request)
        }
        guard let clientID = parameters["client_id"], let client = configuration.appClient(for: clientID),
              let upstream = upstreams[client.upstream] else {
            return .problem(.unknownClient("No app is registered with this client_id."), for: request)
        }
        guard let returnURI = parameters["post_logout_redirect_uri"], client.registeredPostLogoutRedirect(matching: returnURI) != nil else {
            return .problem(.invalidRedirectURI("The post_logout_redirect_uri is not registered for this app. It must match exactly."), for: request)
        }
        let appState = parameters["state"]
        let home = RedirectURI.appending(appState.map { [("state", $0)] } ?? [], to: returnURI)
        guard let hint = parameters["id_token_hint"] else {
            // An upstream that issues no ID tokens (plain OAuth 2.0) keeps no browser session Gatehouse
            // can end: the app revokes its tokens (`/oauth/revoke`) and is sent home.
            guard let settings = configuration.upstreams[client.upstream], !GatehouseApplication.issuesIDTokens(settings) else {
                return .problem(.badRequest("id_token_hint is required: the ID token of the sign-in to end."), for: request)
            }
            audit.record(.logout, clientID: clientID, subject: nil, reason: "no_session")
            return .redirect(to: home)
        }
        // The upstream ID token to hand the upstream's end-session endpoint.
        let upstreamIDToken: String?
        switch client.tokenExposure {
        case .sealed:
            guard let sessions, let signer, let verified = await signer.verifiedIDTokenHint(hint), verified.audience.contains(clientID),
                  let sessionID = SealedSessions.sessionID(fromHandle: verified.sessionHandle, keyRing: sessions.services.settings.keyRing) else {
                return .problem(.badRequest("id_token_hint is not an ID token Gatehouse gave this app."), for: request)
            }
            let session: SessionRecord?
            do {
                session = try await sessions.services.store.session(id: sessionID)
            } catch {
                return .unavailable(.storeUnavailable(), for: request)
            }
            if let session, session.clientID == clientID, session.isLive(at: now()) {
                upstreamIDToken = (try? sessions.services.open(session))?.tokens.idToken
                do {
                    try await sessions.end(session)
                } catch {
                    return .unavailable(.storeUnavailable(), for: request)
                }
                logger.info("session ended by logout", metadata: ["client_id": .string(clientID)])
                audit.record(.logout, clientID: clientID, subject: session.subject, reason: "session_ended")
            } else {
                upstreamIDToken = nil  // already ended: nothing left to end upstream
                audit.record(.logout, clientID: clientID, subject: nil, reason: "already_ended")
            }
        case .passthrough:
            let subject: String
            do throws(OAuthError) {
                subject = try await upstream.verifyIDTokenHint(hint)
            } catch where error.status >= 503 {
                return .unavailable(.identityUnavailable(), for: request)
            } catch {
                return .problem(.badRequest("id_token_hint is not an ID token of this app's upstream."), for: request)
            }
            upstreamIDToken = hint
            audit.record(.logout, clientID: clientID, subject: subject, reason: "upstream_session")
        }
        guard let upstreamIDToken else { return .redirect(to: home) }
        let state = SecureToken.generate()
        let endSession: String?
        do throws(OAuthError) {
            endSession = try await upstream.endSessionURL(idToken: upstreamIDToken, state: state,
                                                          postLogoutRedirectURI: issuer + "/oauth/logout/callback")
        } catch {
            // Gatehouse's session is over; the upstream's browser session outlives it.
            logger.warning("upstream end-session endpoint unknown; the app is sent home", metadata: ["upstream": .string(client.upstream)])
            return .redirect(to: home)
        }
        guard let endSession else { return .redirect(to: home) }
        let pending = PendingLogout(clientID: clientID, postLogoutRedirectURI: returnURI, appState: appState)
        do {
            try await store.insertTransaction(sealed: try pending.sealed(with: state), stateHash: PendingLogout.storeKey(state: state),
                                              expiresAt: expiry(after: configuration.server.transactionLifetime))
        } catch {
            return .unavailable(.storeUnavailable(), for: request)
        }
        return .redirect(to: endSession)
    }

    /// `GET /oauth/logout/callback`: the upstream's end-session endpoint sends the browser back
    /// with Gatehouse's state; a state Gatehouse did not issue (or already used) gets an error page.
    func logoutCallback(_ request: Request) async -> Response {
        guard let parameters = try? FormParameters(parsing: Array((request.uri.query ?? "").utf8), recognizing: ["state"]),
              let state = parameters["state"] else {
            return .problem(.unknownState("The logout response carries no state."), for: request)
        }
        let sealed: Data?
        do {
            sealed = try await store.consumeTransaction(stateHash: PendingLogout.storeKey(state: state), now: now())
        } catch {
            return .unavailable(.storeUnavailable(), for: request)
        }
        guard let sealed, let pending = try? PendingLogout.unsealed(sealed, with: state) else {
            logger.notice("logout callback with an unknown, used or expired state")
            return .problem(.unknownState("This logout has expired, was already completed, or was not begun here."), for: request)
        }
        return .redirect(to: RedirectURI.appending(pending.appState.map { [("state", $0)] } ?? [], to: pending.postLogoutRedirectURI))
    }
}

/// A logout on its way through the upstream's end-session endpoint, stored like a sign-in
/// transaction (the hash of Gatehouse's state as key, sealed under the state) and consumed once.
struct PendingLogout: Codable {
    let clientID: String
    let postLogoutRedirectURI: String
    let appState: String?

    private static let purpose = "gatehouse logout v1"

    static func storeKey(state: String) -> String { "logout." + SecureToken.hash(state) }

    func sealed(with state: String) throws -> Data {
        try TokenSeal.seal(JSONEncoder().encode(self), with: state, purpose: Self.purpose)
    }

    static func unsealed(_ sealed: Data, with state: String) throws -> PendingLogout {
        try JSONDecoder().decode(PendingLogout.self, from: TokenSeal.open(sealed, with: state, purpose: purpose))
    }
}
