import Foundation
import GatehouseCore
import GatehouseUpstreams
import HTTPTypes
import Hummingbird
import Logging

extension AuthorizationServer {
    /// `GET /oauth/callback`: the upstream returns the browser here (callback mode). Gatehouse
    /// consumes the transaction, swaps the code with its secret and hands the app a one-time code.
    func callback(_ request: Request) async -> Response {
        let parameters: FormParameters
        do {
            parameters = try FormParameters(parsing: Array((request.uri.query ?? "").utf8),
                                            recognizing: ["code", "state", "error", "error_description", "iss"])
        } catch {
            return .problem(.badRequest("The sign-in response is malformed: \(error.description)."), for: request)
        }
        guard let state = parameters["state"] else {
            return .problem(.unknownState("The sign-in response carries no state."), for: request)
        }
        return await completeCallback(parameters, state: state, via: .query, request: request)
    }

    /// `GET {path}` of an upstream whose sign-in returns to a path its contract fixes (under the
    /// app's registered base URL) with its code and no `state` (`SignInReturn.cookie`): the state
    /// is the `__Secure-` cookie the authorize route set. The cookie is cleared whatever happens.
    func cookieCallback(_ request: Request, path: String) async -> Response {
        let parameters: FormParameters
        do {
            parameters = try FormParameters(parsing: Array((request.uri.query ?? "").utf8),
                                            recognizing: ["code", "error", "error_description"])
        } catch {
            return .problem(.badRequest("The sign-in response is malformed: \(error.description)."), for: request)
        }
        var response: Response
        if let state = Self.signInCookie(in: request) {
            response = await completeCallback(parameters, state: state, via: .cookie(path: path), request: request)
        } else {
            logger.info("sign-in callback without the sign-in cookie", metadata: ["path": .string(path)])
            response = .problem(.unknownState("No sign-in is in progress in this browser, or it has expired."), for: request)
        }
        response.headers.append(HTTPField(name: .setCookie, value: Self.signInCookieName + "=; " + Self.signInCookieAttributes(path: path) + "; Max-Age=0"))
        return response
    }

    /// The cookie that carries Gatehouse's state through a sign-in that returns without it.
    static let signInCookieName = "__Secure-gatehouse-signin"
    /// Its attributes: sent only to that sign-in's callback path (never to relayed routes and their
    /// backends), only over https, never to scripts, and on the provider's top-level redirect.
    static func signInCookieAttributes(path: String) -> String {
        "Path=\(path); Secure; HttpOnly; SameSite=Lax"
    }

    static func signInCookie(in request: Request) -> String? {
        for header in request.headers[values: .cookie] {
            for pair in header.split(separator: ";") {
                let trimmed = pair.trimmingCharacters(in: .whitespaces)
                if trimmed.hasPrefix(signInCookieName + "=") {
                    let value = String(trimmed.dropFirst(signInCookieName.count + 1))
                    return value.isEmpty ? nil : value
                }
            }
        }
        return nil
    }

    /// The rest of a callback once Gatehouse's state is known (from the query, or from the cookie
    /// of a sign-in that returns without it: each upstream only through its own way back).
    private func completeCallback(_ parameters: FormParameters, state: String, via carrier: SignInReturn, request: Request) async -> Response {
        let transaction: AuthorizationTransaction?
        do {
            transaction = try await consumeTransaction(state: state, wiring: .callback)
        } catch {
            logger.error("store failed to consume a transaction", metadata: ["error": .string(String(describing: type(of: error)))])
            return .problem(.storeUnavailable(), for: request)
        }
        guard let transaction, transaction.wiring == .callback, let upstream = upstreams[transaction.upstream],
              upstream.signInReturn == carrier else {
            logger.info("callback with unknown, used or expired state")
            return .problem(.unknownState("This sign-in has expired or was already completed."), for: request)
        }
        do throws(OAuthError) {
            try upstream.checkResponseIssuer(parameters["iss"], memo: transaction.memo)
        } catch {
            logger.warning("security event: the authorization response names another issuer", metadata: ["upstream": .string(transaction.upstream)])
            return .redirect(to: appRedirect(transaction.redirectURI, error: error, state: transaction.appState))
        }
        if let error = parameters["error"] {
            let relayed = OAuthError.fromAuthorizationResponse(code: error, detail: parameters["error_description"])
            logger.info("upstream returned an authorization error", metadata: ["error": .string(relayed.code)])
            return .redirect(to: appRedirect(transaction.redirectURI, error: relayed, state: transaction.appState))
        }
        guard let code = parameters["code"] else {
            return .redirect(to: appRedirect(transaction.redirectURI,
                                             error: .badUpstream("the authorization server returned no code"),
                                             state: transaction.appState))
        }
        let grant: UpstreamGrant
        do {
            grant = try await upstream.completeAuthorization(code: code, redirectURI: configuration.server.callbackURL,
                                                             memo: transaction.memo, appCodeVerifier: nil)
        } catch {
            return .redirect(to: appRedirect(transaction.redirectURI, error: Self.authorizationResponseError(error),
                                             state: transaction.appState))
        }
        let issued = IssuedCode(clientID: transaction.clientID, redirectURI: transaction.redirectURI,
                                codeChallenge: transaction.codeChallenge, upstream: transaction.upstream, tokenResponse: grant.tokens?.json ?? Data("{}".utf8),
                                userinfo: grant.userinfo, appNonce: transaction.appNonce, subject: grant.subject)
        // An uncertified instance of an app that requires attestation waits here for an e-mailed code.
        if let instances, let pause = await instances.certificationPause(issued, appState: transaction.appState, request: request) {
            return pause
        }
        return await redirectWithCode(issued, appState: transaction.appState)
    }

    /// On a redirect only `server_error` and `temporarily_unavailable` describe a failed exchange (RFC 6749 §4.1.2.1).
    static func authorizationResponseError(_ error: OAuthError) -> OAuthError {
        if error.status >= 503 { return .upstreamUnavailable(error.detail) }
        // An OAuth error of the upstream's own (invalid_grant…) is its refusal; Gatehouse's own
        // refusals (an ID token that fails a check, a wrong discovery document) say so themselves.
        return error.code == "server_error" ? .badUpstream(error.detail)
            : .badUpstream("the authorization server did not accept the sign-in: \(error.detail)")
    }
}
