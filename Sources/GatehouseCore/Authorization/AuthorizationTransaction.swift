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
    /// What the upstream's profile must remember between sending the browser and getting it back.
    public var memo: UpstreamMemo
    /// The app's own `nonce`, echoed in the ID token Gatehouse gives it.
    public var appNonce: String?
    public var expiresAt: Date

    public init(clientID: String, redirectURI: String, appState: String, codeChallenge: String, scopes: [String],
                upstream: String, wiring: UpstreamWiring, memo: UpstreamMemo, appNonce: String? = nil, expiresAt: Date) {
        self.clientID = clientID
        self.redirectURI = redirectURI
        self.appState = appState
        self.codeChallenge = codeChallenge
        self.scopes = scopes
        self.upstream = upstream
        self.wiring = wiring
        self.memo = memo
        self.appNonce = appNonce
        self.expiresAt = expiresAt
    }
}

/// What an upstream profile remembers for one sign-in, sealed with its transaction: Gatehouse's
/// PKCE verifier, the nonce and ACR it asked for, and the issuer it expects to answer (the
/// mix-up defence of RFC 9207 and RFC 9700 §4.4).
public struct UpstreamMemo: Sendable, Codable, Equatable {
    /// Gatehouse's own PKCE verifier toward the upstream (callback mode).
    public var codeVerifier: String?
    /// Relay mode: the app's verifier goes to the upstream (the app's challenge went with the browser).
    public var forwardsAppVerifier: Bool
    public var nonce: String?
    public var acrValues: String?
    /// The issuer this sign-in was sent to.
    public var issuer: String?
    /// Whether that issuer promised `iss` on its authorization responses (RFC 9207 §2.4).
    public var requiresResponseIssuer: Bool?

    public init(codeVerifier: String? = nil, forwardsAppVerifier: Bool = false, nonce: String? = nil, acrValues: String? = nil,
                issuer: String? = nil, requiresResponseIssuer: Bool? = nil) {
        self.requiresResponseIssuer = requiresResponseIssuer
        self.codeVerifier = codeVerifier
        self.forwardsAppVerifier = forwardsAppVerifier
        self.nonce = nonce
        self.acrValues = acrValues
        self.issuer = issuer
    }
}

extension UpstreamWiring: Codable {}

extension AuthorizationTransaction {
    private enum CodingKeys: String, CodingKey {
        case clientID, redirectURI, appState, codeChallenge, scopes, upstream, wiring, memo, appNonce, expiresAt
        case upstreamCodeVerifier  // written before upstream profiles (memo); read so sign-ins in flight survive an upgrade
    }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        clientID = try container.decode(String.self, forKey: .clientID)
        redirectURI = try container.decode(String.self, forKey: .redirectURI)
        appState = try container.decode(String.self, forKey: .appState)
        codeChallenge = try container.decode(String.self, forKey: .codeChallenge)
        scopes = try container.decode([String].self, forKey: .scopes)
        upstream = try container.decode(String.self, forKey: .upstream)
        wiring = try container.decode(UpstreamWiring.self, forKey: .wiring)
        memo = try container.decodeIfPresent(UpstreamMemo.self, forKey: .memo)
            ?? UpstreamMemo(codeVerifier: try container.decodeIfPresent(String.self, forKey: .upstreamCodeVerifier))
        appNonce = try container.decodeIfPresent(String.self, forKey: .appNonce)
        expiresAt = try container.decode(Date.self, forKey: .expiresAt)
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(clientID, forKey: .clientID)
        try container.encode(redirectURI, forKey: .redirectURI)
        try container.encode(appState, forKey: .appState)
        try container.encode(codeChallenge, forKey: .codeChallenge)
        try container.encode(scopes, forKey: .scopes)
        try container.encode(upstream, forKey: .upstream)
        try container.encode(wiring, forKey: .wiring)
        try container.encode(memo, forKey: .memo)
        try container.encodeIfPresent(appNonce, forKey: .appNonce)
        try container.encode(expiresAt, forKey: .expiresAt)
    }
}

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
