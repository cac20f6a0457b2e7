/// A request to `/oauth/token` from a public app client (RFC 6749 §4.1.3 and §6, RFC 7636 §4.5).
public enum TokenRequest: Sendable, Equatable {
    /// Redeem a Gatehouse code (callback mode) or an upstream code with its `state` (relay mode).
    /// `redirectURI` is `nil` for a code of the authorization challenge endpoint, whose request had
    /// none (draft-ietf-oauth-first-party-apps §5).
    case authorizationCode(clientID: String, code: String, redirectURI: String?, codeVerifier: String, state: String?)
    /// Swap a refresh token; Gatehouse adds its secret toward the upstream.
    case refreshToken(clientID: String, refreshToken: String, scope: String?)

    public var clientID: String {
        switch self {
        case .authorizationCode(let clientID, _, _, _, _), .refreshToken(let clientID, _, _): clientID
        }
    }

    /// The parameters the token endpoint reads; others are ignored (RFC 6749 §3.2).
    public static let parameterNames: Set<String> = [
        "grant_type", "client_id", "code", "redirect_uri", "code_verifier", "state", "refresh_token", "scope",
    ]

    /// Reads the form; every missing or malformed parameter is an `invalid_request`.
    public static func parse(_ form: FormParameters) throws(OAuthError) -> TokenRequest {
        guard let grantType = form["grant_type"] else { throw .invalidRequest("grant_type is required") }
        guard let clientID = form["client_id"] else {
            throw .invalidRequest("client_id is required: apps are public clients and identify themselves with it")
        }
        switch grantType {
        case "authorization_code":
            guard let code = form["code"] else { throw .invalidRequest("code is required") }
            let redirectURI = form["redirect_uri"]
            guard let verifier = form["code_verifier"] else {
                throw .invalidRequest("code_verifier is required (PKCE, RFC 7636 §4.5)")
            }
            guard PKCE.isWellFormedVerifier(verifier) else {
                throw .invalidRequest("code_verifier must be 43 to 128 unreserved characters (RFC 7636 §4.1)")
            }
            return .authorizationCode(clientID: clientID, code: code, redirectURI: redirectURI,
                                      codeVerifier: verifier, state: form["state"])
        case "refresh_token":
            guard let refreshToken = form["refresh_token"] else { throw .invalidRequest("refresh_token is required") }
            return .refreshToken(clientID: clientID, refreshToken: refreshToken, scope: form["scope"])
        default:
            throw .unsupportedGrantType("grant_type must be authorization_code or refresh_token")
        }
    }
}
