public import Foundation

/// One sign-in in flight: what the app asked for at `/oauth/authorize`, kept until the upstream
/// answers. Stored under the SHA-256 of Gatehouse's own `state` and consumed exactly once.
public struct AuthorizationTransaction: Sendable, Codable, Equatable {
    public var clientID: String
    /// The redirect URI exactly as the app sent it.
    public var redirectURI: String
    /// The app's own `state`, returned to it untouched.
    public var appState: String
    /// The app's S256 `code_challenge`; the app's `code_verifier` must match it.
    public var codeChallenge: String
    public var scopes: [String]
    public var upstream: String
    public var wiring: UpstreamWiring
    /// Gatehouse's own PKCE verifier toward an upstream that takes PKCE (callback mode).
    public var upstreamCodeVerifier: String?
    public var expiresAt: Date

    public init(clientID: String, redirectURI: String, appState: String, codeChallenge: String, scopes: [String],
                upstream: String, wiring: UpstreamWiring, upstreamCodeVerifier: String?, expiresAt: Date) {
        self.clientID = clientID
        self.redirectURI = redirectURI
        self.appState = appState
        self.codeChallenge = codeChallenge
        self.scopes = scopes
        self.upstream = upstream
        self.wiring = wiring
        self.upstreamCodeVerifier = upstreamCodeVerifier
        self.expiresAt = expiresAt
    }
}

extension UpstreamWiring: Codable {}

extension AuthorizationTransaction {
    /// The store key of a transaction: the SHA-256 of Gatehouse's `state`, namespaced by wiring,
    /// so that only the endpoint of the transaction's own wiring can find (and so consume) it:
    /// a relay-mode state shown to `/oauth/callback`, or a callback-mode state shown to
    /// `/oauth/token`, is refused without burning the sign-in.
    public static func storeKey(state: String, wiring: UpstreamWiring) -> String {
        switch wiring {
        case .callback: SecureToken.hash(state)
        case .relay: "relay." + SecureToken.hash(state)
        }
    }
}

extension AuthorizationTransaction {
    private static let sealPurpose = "gatehouse transaction v1"

    /// The transaction sealed under a key derived from Gatehouse's `state`: the row is keyed by
    /// the state's hash, so a copy of the database can neither read the upstream PKCE verifier
    /// nor finish the sign-in.
    public func sealed(with state: String) throws -> Data {
        try TokenSeal.seal(JSONEncoder().encode(self), with: state, purpose: Self.sealPurpose)
    }

    /// Opens what `sealed(with:)` made; throws for another state or a row from before sealing.
    public static func unsealed(_ sealed: Data, with state: String) throws -> AuthorizationTransaction {
        try JSONDecoder().decode(AuthorizationTransaction.self, from: TokenSeal.open(sealed, with: state, purpose: sealPurpose))
    }
}
