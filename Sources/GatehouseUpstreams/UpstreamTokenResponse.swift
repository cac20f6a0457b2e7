public import Foundation
public import GatehouseCore

/// A successful token response from an upstream (RFC 6749 §5.1), checked and kept verbatim.
public struct UpstreamTokenResponse: Sendable {
    /// The JSON object exactly as the upstream sent it (for passthrough).
    public let json: Data
    public let accessToken: Secret
    public let tokenType: String
    public let refreshToken: Secret?
    public let expiresIn: Int?
    /// The OpenID Connect ID token, when the upstream sent one (validated by the profile, not here).
    public let idToken: String?

    /// Checks that `body` is a JSON object with a string `access_token` and `token_type`.
    public init(body: Data) throws(OAuthError) {
        guard let object = (try? JSONSerialization.jsonObject(with: body)) as? [String: Any] else {
            throw .badUpstream("the authorization server's token response is not a JSON object")
        }
        guard let accessToken = object["access_token"] as? String, !accessToken.isEmpty else {
            throw .badUpstream("the authorization server's token response has no access_token")
        }
        guard let tokenType = object["token_type"] as? String, !tokenType.isEmpty else {
            throw .badUpstream("the authorization server's token response has no token_type")
        }
        self.json = body
        self.accessToken = Secret(accessToken)
        self.tokenType = tokenType
        self.refreshToken = (object["refresh_token"] as? String).map(Secret.init)
        self.idToken = object["id_token"] as? String
        // Some servers send a number as a string ("3599").
        self.expiresIn = (object["expires_in"] as? NSNumber)?.intValue ?? (object["expires_in"] as? String).flatMap { Int($0) }
    }
}
