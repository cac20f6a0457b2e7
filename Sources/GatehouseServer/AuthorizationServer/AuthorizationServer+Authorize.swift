import GatehouseCore
import GatehouseUpstreams
import Hummingbird
import Logging

extension AuthorizationServer {
    /// `GET /oauth/authorize` (RFC 6749 §4.1.1, RFC 7636 §4.3): checks the app, records a
    /// transaction and sends the browser to the upstream with Gatehouse's own `state`.
    func authorize(_ request: Request) async -> Response {
        var parameters: FormParameters
        do {
            parameters = try FormParameters(parsing: Array((request.uri.query ?? "").utf8),
                                            recognizing: AuthorizationRequest.parameterNames.union(["request_uri"]))
        } catch {
            return .problem(.badRequest("The sign-in request is malformed: \(error.description)."), for: request)
        }
        // A request Gatehouse recorded (an in-app sign-in that continues in the browser): its
        // parameters, and only those, with the same client_id (RFC 9126 §4).
        if let requestURI = parameters["request_uri"] {
            let pulled: String?
            do {
                pulled = try await pullAuthorizationRequest(requestURI)
            } catch {
                return .problem(.storeUnavailable(), for: request)
            }
            guard let pulled, let pushed = try? FormParameters(parsing: Array(pulled.utf8), recognizing: AuthorizationRequest.parameterNames),
                  pushed["client_id"] == parameters["client_id"] else {
                logger.info("authorize refused", metadata: ["code": "unknown_request_uri"])
                return .problem(.badRequest("The request_uri is unknown, already used, expired, or another app's."), for: request)
            }
            parameters = pushed
        }
        // A registered instance is a client only while the store says it is live.
        var clients = configuration.clients
        var instance: InstanceRecord?
        if let clientID = parameters["client_id"], let client = configuration.appClient(for: clientID), client.isInstance {
            do {
                instance = try await store.instance(id: clientID)
            } catch {
                return .problem(.storeUnavailable(), for: request)
            }
            if let instance, instance.isLive(at: now()) {
                var client = client
                // An instance that registered fewer redirect URIs than its app's uses only those.
                if let narrowed = instance.redirectURIs { client.redirectURIs.removeAll { !narrowed.contains($0.registered) } }
                clients[clientID] = client
            }
        }
        switch AuthorizationRequest.decide(parameters, clients: clients) {
        case .refuse(let problem):
            logger.info("authorize refused", metadata: ["code": .string(problem.code)])
            return .problem(problem, for: request)
        case .redirectError(let redirectURI, let error, let state):
            logger.info("authorize error sent to app", metadata: ["error": .string(error.code)])
            return .redirect(to: appRedirect(redirectURI, error: error, state: state))
        case .proceed(let authorization):
            // Unless an e-mailed code may certify the instance on the way, a sign-in that would get no
            // tokens is refused now, sparing the user.
            if let client = clients[authorization.clientID], !(client.isInstance && client.instances?.manualCertification == true) {
                do throws(OAuthError) {
                    try AppInstances.requireCertification(of: client, instance: instance)
                } catch {
                    logger.info("authorize refused", metadata: ["error": .string(error.code)])
                    return .redirect(to: appRedirect(authorization.redirectURI, error: error, state: authorization.state))
                }
            }
            return await begin(authorization, request: request)
        }
    }

    private func begin(_ authorization: AuthorizationRequest, request: Request) async -> Response {
        guard let client = configuration.appClient(for: authorization.clientID),
              let upstream = upstreams[client.upstream] else {
            return .redirect(to: appRedirect(authorization.redirectURI,
                                             error: .badUpstream("the app's upstream is not configured"), state: authorization.state))
        }
        let state = SecureToken.generate()
        // Callback mode: the upstream returns to Gatehouse. Relay mode: straight to the app.
        let upstreamRedirectURI = client.wiring == .callback ? configuration.server.callbackURL : authorization.redirectURI
        let begun: AuthorizationBegun
        do throws(OAuthError) {
            begun = try await upstream.beginAuthorization(AuthorizationStart(
                state: state, redirectURI: upstreamRedirectURI, scopes: authorization.scopes, wiring: client.wiring,
                appCodeChallenge: authorization.codeChallenge))
        } catch {
            logger.warning("sign-in could not begin", metadata: ["upstream": .string(client.upstream), "error": .string(error.code)])
            return .redirect(to: appRedirect(authorization.redirectURI, error: Self.authorizationResponseError(error), state: authorization.state))
        }
        let transaction = AuthorizationTransaction(
            clientID: client.clientID, redirectURI: authorization.redirectURI, appState: authorization.state,
            codeChallenge: authorization.codeChallenge, scopes: authorization.scopes, upstream: client.upstream,
            wiring: client.wiring, memo: begun.memo, appNonce: authorization.nonce,
            expiresAt: expiry(after: configuration.server.transactionLifetime))
        do {
            try await store.insertTransaction(sealed: transaction.sealed(with: state),
                                              stateHash: AuthorizationTransaction.storeKey(state: state, wiring: transaction.wiring),
                                              expiresAt: transaction.expiresAt)
        } catch {
            logger.error("store failed to record a transaction", metadata: ["error": .string(String(describing: type(of: error)))])
            return .problem(.storeUnavailable(), for: request)
        }
        logger.info("authorization transaction begun", metadata: [
            "client_id": .string(client.clientID), "upstream": .string(client.upstream), "wiring": .string(client.wiring.rawValue),
        ])
        var response = Response.redirect(to: begun.url)
        if case .cookie(let path) = upstream.signInReturn {
            // The upstream will not echo Gatehouse's state: this browser carries it instead.
            let seconds = Int(configuration.server.transactionLifetime.inSeconds)
            response.headers[.setCookie] = "\(Self.signInCookieName)=\(state); \(Self.signInCookieAttributes(path: path)); Max-Age=\(seconds)"
        }
        return response
    }

    /// Consumes the transaction of Gatehouse's `state` for one wiring and opens it; `nil` when
    /// unknown, used, expired, of the other wiring, or not sealed under this state.
    func consumeTransaction(state: String, wiring: UpstreamWiring) async throws -> AuthorizationTransaction? {
        guard let sealed = try await store.consumeTransaction(stateHash: AuthorizationTransaction.storeKey(state: state, wiring: wiring), now: now())
        else { return nil }
        return try? AuthorizationTransaction.unsealed(sealed, with: state)
    }
}
