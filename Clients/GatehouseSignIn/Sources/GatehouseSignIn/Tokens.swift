/// What the token endpoint answered for the dialogue's authorization code (RFC 6749 §5.1).
public struct Tokens: Sendable, Equatable {
    public let accessToken: String
    /// `Bearer`, or `DPoP` when the tokens are bound to the client's `DPoPKey`.
    public let tokenType: String
    public let expiresIn: Int?
    public let refreshToken: String?
    public let idToken: String?
    public let scope: String?
    /// The whole JSON object, as the token endpoint sent it.
    public let raw: [String: JSONValue]

    /// Nil unless `raw` has a non-empty `access_token` and `token_type`.
    public init?(raw: [String: JSONValue]) {
        guard let accessToken = raw["access_token"]?.stringValue, !accessToken.isEmpty,
              let tokenType = raw["token_type"]?.stringValue, !tokenType.isEmpty
        else { return nil }
        self.accessToken = accessToken
        self.tokenType = tokenType
        self.expiresIn = raw["expires_in"]?.intValue
        self.refreshToken = raw["refresh_token"]?.stringValue
        self.idToken = raw["id_token"]?.stringValue
        self.scope = raw["scope"]?.stringValue
        self.raw = raw
    }
}

extension Tokens: CustomStringConvertible, CustomDebugStringConvertible {
    /// Never a token: the type, lifetime and scope only.
    public var description: String {
        "Tokens(tokenType: \(tokenType), expiresIn: \(expiresIn.map(String.init) ?? "nil"), scope: \(scope ?? "nil"), "
            + "refreshToken: \(refreshToken == nil ? "no" : "yes"), idToken: \(idToken == nil ? "no" : "yes"))"
    }

    public var debugDescription: String { description }
}
