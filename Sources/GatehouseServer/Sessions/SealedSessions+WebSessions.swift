import Foundation
import GatehouseCore
import GatehouseRelay
import GatehouseSessions
import HTTPTypes
import Hummingbird
import Logging

extension SealedSessions {
    static let sessionCodeKind = "session_code"
    static let sessionCodeLifetime = 60

    /// `POST /oauth/session_code` (seed 000): a one-time, 60-second code for the app's sealed
    /// session, which its webview trades at `/session` for a web-session cookie.
    func sessionCode(_ request: Request) async -> Response {
        let view: SessionServices.SessionView
        switch await appSession(request) {
        case .success(let found): view = found
        case .failure(let refusal): return refusal.response
        }
        guard configuration.webviews != nil else {
            return .oauthError(.invalidRequest("web sessions are not configured (webviews)"))
        }
        // A web session is a grant too: under `attestation: required`, only a certified instance's session opens one.
        if let client = configuration.appClient(for: view.clientID), client.instances?.attestation == .required {
            do throws(OAuthError) {
                let instance = client.isInstance ? try await instances?.liveInstance(view.clientID, proof: nil, checkingKey: false).0 : nil
                try AppInstances.requireCertification(of: client, instance: instance)
            } catch {
                logger.info("session code refused", metadata: ["error": .string(error.code)])
                return .oauthError(error)
            }
        }
        let code = SecureToken.generate()
        do {
            let stored = try await store.insertOnce(kind: Self.sessionCodeKind, keyHash: SecureToken.hash(code), value: Data(view.sessionID.utf8),
                                                    expiresAt: now().addingTimeInterval(Double(Self.sessionCodeLifetime)), now: now())
            guard stored else { return .oauthError(.serverError("Gatehouse could not record the session code")) }
        } catch {
            return .oauthError(.serverError("Gatehouse cannot reach its store right now"))
        }
        return .oauthJSON(JSONCoding.encode(SessionCodeResponse(session_code: code, expires_in: Self.sessionCodeLifetime)))
    }

    /// `GET /session?session_code=…&return_to=…`: spends the code, sets the `__Host-` web-session
    /// cookie (bound to the same session) and sends the webview to `return_to`, which must be
    /// under one of `webviews.origins`.
    func openWebSession(_ request: Request) async -> Response {
        guard let webviews = configuration.webviews else { return .problem(.notFound(), for: request) }
        let sessions = services
        let parameters: FormParameters
        do {
            parameters = try FormParameters(parsing: Array((request.uri.query ?? "").utf8), recognizing: ["session_code", "return_to"])
        } catch {
            return .problem(.badRequest("The request is malformed: \(error.description)."), for: request)
        }
        guard let code = parameters["session_code"] else { return .problem(.badRequest("session_code is required."), for: request) }
        // Spent first: whatever happens next, a code opens at most one web session.
        let owner: Data?
        do {
            owner = try await store.consumeOnce(kind: Self.sessionCodeKind, keyHash: SecureToken.hash(code), now: now())
        } catch {
            return .unavailable(.storeUnavailable(), for: request)
        }
        guard let returnTo = parameters["return_to"], let destination = Self.webDestination(returnTo, origins: webviews.origins) else {
            return .problem(.badRequest("return_to must be an absolute URL under one of the configured web origins."), for: request)
        }
        guard let owner else {
            return .problem(.badRequest("The session code is invalid, expired or already used."), for: request)
        }
        let sessionID = String(decoding: owner, as: UTF8.self)
        let session: SessionRecord?
        do {
            session = try await sessions.store.session(id: sessionID)
        } catch {
            return .unavailable(.storeUnavailable(), for: request)
        }
        let now = self.now()
        guard let session, session.isLive(at: now) else {
            return .problem(.badRequest("The session code is invalid, expired or already used."), for: request)
        }
        let cookie = SessionServices.cookiePrefix + SecureToken.generate()
        let expiresAt = min(session.expiresAt, now.addingTimeInterval(webviews.cookieLifetime.inSeconds))
        do {
            try await sessions.store.insertAccessToken(hash: SecureToken.hash(cookie), sessionID: session.id, expiresAt: expiresAt)
        } catch {
            return .unavailable(.storeUnavailable(), for: request)
        }
        audit.record(.web_session, clientID: session.clientID, subject: session.subject)
        var headers = HTTPFields()
        headers[.location] = destination
        headers[.cacheControl] = "no-store"
        headers[HTTPField.Name("Referrer-Policy")!] = "no-referrer"
        headers[.setCookie] = "\(SessionServices.sessionCookieName)=\(cookie); Path=/; Secure; HttpOnly; SameSite=Lax; "
            + "Max-Age=\(max(1, Int(expiresAt.timeIntervalSince(now))))"
        return Response(status: .seeOther, headers: headers)
    }

    /// `return_to` when it is an absolute URL of one of `origins` (no userinfo, no backslash, no
    /// control character), as it was sent; `nil` otherwise.
    static func webDestination(_ returnTo: String, origins: [String]) -> String? {
        guard returnTo.utf8.count <= 2048, returnTo.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F && $0 != UInt8(ascii: "\\") }),
              let components = URLComponents(string: returnTo), components.user == nil, components.password == nil,
              let scheme = components.scheme?.lowercased(), scheme == "https" || scheme == "http", let host = components.host, !host.isEmpty
        else { return nil }
        var origin = components
        origin.path = ""
        origin.query = nil
        origin.fragment = nil
        guard let text = origin.string, let canonical = GatehouseConfiguration.webOrigin(text), origins.contains(canonical) else { return nil }
        // The path must start at the root of that origin (no `//evil` authority trick once re-parsed).
        guard components.percentEncodedPath.isEmpty || (components.percentEncodedPath.hasPrefix("/") && !components.percentEncodedPath.hasPrefix("//"))
        else { return nil }
        return returnTo
    }
}

struct SessionCodeResponse: Encodable {
    let session_code: String
    let expires_in: Int
}
