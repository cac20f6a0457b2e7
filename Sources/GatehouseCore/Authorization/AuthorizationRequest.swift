/// A validated `/oauth/authorize` request (RFC 6749 §4.1.1 with RFC 7636 §4.3).
public struct AuthorizationRequest: Sendable, Equatable {
    public var clientID: String
    public var redirectURI: String
    public var state: String
    public var codeChallenge: String
    public var scopes: [String]
    /// The app's OpenID Connect `nonce`, echoed in the ID token Gatehouse gives it.
    public var nonce: String? = nil
}

/// What Gatehouse does with an authorization request.
public enum AuthorizationDecision: Sendable, Equatable {
    /// The app or its redirect URI cannot be trusted: show an error page, never redirect (RFC 6749 §4.1.2.1).
    case refuse(GatehouseProblem)
    /// The redirect URI is trusted: send the error back to the app with its state.
    case redirectError(redirectURI: String, error: OAuthError, state: String?)
    /// Everything checks out: begin a transaction.
    case proceed(AuthorizationRequest)
}

extension AuthorizationRequest {
    /// The parameters `/oauth/authorize` reads; others are ignored (RFC 6749 §3.1).
    public static let parameterNames: Set<String> = [
        "response_type", "client_id", "redirect_uri", "scope", "state", "code_challenge", "code_challenge_method",
        "nonce",
    ]

    /// Decides on an authorization request. Client and redirect URI are checked first: until
    /// both are known good, no error may be redirected anywhere.
    public static func decide(_ parameters: FormParameters, clients: [String: AppClient]) -> AuthorizationDecision {
        guard let clientID = parameters["client_id"] else {
            return .refuse(.unknownClient("The request has no client_id."))
        }
        guard let client = clients[clientID] else {
            return .refuse(.unknownClient("No app is registered with this client_id."))
        }
        guard let redirectURI = parameters["redirect_uri"] else {
            return .refuse(.invalidRedirectURI("The request has no redirect_uri; native apps must send one (RFC 8252 §8.4)."))
        }
        guard client.registeredRedirect(matching: redirectURI) != nil else {
            return .refuse(.invalidRedirectURI("The redirect_uri is not registered for this app. It must match exactly."))
        }
        let state = parameters["state"]
        func fail(_ error: OAuthError) -> AuthorizationDecision {
            .redirectError(redirectURI: redirectURI, error: error, state: state)
        }
        do throws(OAuthError) {
            try checkResponseType(parameters)
        } catch {
            return fail(error)
        }
        guard let state else {
            return fail(.invalidRequest("state is required"))
        }
        let grant: Grant
        do throws(OAuthError) {
            grant = try checkGrant(parameters, client: client)
        } catch {
            return fail(error)
        }
        return .proceed(AuthorizationRequest(clientID: clientID, redirectURI: redirectURI, state: state,
                                             codeChallenge: grant.codeChallenge, scopes: grant.scopes, nonce: grant.nonce))
    }

    /// `response_type`, which must be `code`.
    public static func checkResponseType(_ parameters: FormParameters) throws(OAuthError) {
        guard let responseType = parameters["response_type"] else {
            throw .invalidRequest("response_type is required")
        }
        guard responseType == "code" else {
            throw .unsupportedResponseType("only response_type=code is supported")
        }
    }

    /// What an authorization request asks for, checked: the S256 PKCE challenge, the scopes (the
    /// app's own, all of them when it names none) and the `nonce`.
    public struct Grant: Sendable, Equatable {
        public let codeChallenge: String
        public let scopes: [String]
        public let nonce: String?
    }

    /// The checks every authorization request of `client` passes, at `/oauth/authorize` and at the
    /// authorization challenge endpoint alike.
    public static func checkGrant(_ parameters: FormParameters, client: AppClient) throws(OAuthError) -> Grant {
        guard let challenge = parameters["code_challenge"] else {
            throw .invalidRequest("code_challenge is required (PKCE, RFC 7636)")
        }
        guard let method = parameters["code_challenge_method"] else {
            throw .invalidRequest("code_challenge_method is required and must be S256")
        }
        guard method == PKCE.method else {
            throw .invalidRequest("code_challenge_method must be S256; plain is not accepted")
        }
        guard PKCE.isWellFormedChallenge(challenge) else {
            throw .invalidRequest("code_challenge must be 43 base64url characters (S256)")
        }
        let requested = parameters["scope"].map { $0.split(separator: " ").map(String.init) } ?? client.scopes
        if let unknown = requested.first(where: { !client.scopes.contains($0) }) {
            throw .invalidScope("the scope '\(unknown.prefix(64))' is not allowed for this app")
        }
        if let nonce = parameters["nonce"], nonce.isEmpty || nonce.utf8.count > 512 {
            throw .invalidRequest("nonce must be 1 to 512 characters")
        }
        return Grant(codeChallenge: challenge, scopes: requested, nonce: parameters["nonce"])
    }
}
