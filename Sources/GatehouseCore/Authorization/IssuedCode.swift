public import Foundation

/// What a Gatehouse authorization code stands for until the app redeems it (≤ 60 s, single use).
///
/// The store never sees the code nor the tokens: it keeps the code's SHA-256 as the key and
/// this value sealed with AES-256-GCM under a key derived from the code itself (HKDF-SHA256),
/// so a copy of the database cannot redeem a code or read the upstream tokens behind it.
public struct IssuedCode: Sendable, Codable, Equatable {
    public var clientID: String
    public var redirectURI: String
    public var codeChallenge: String
    public var upstream: String
    /// The upstream's token response, as JSON.
    public var tokenResponse: Data
    /// The verified userinfo claims, exactly as the upstream gave them (OpenID Connect upstreams).
    public var userinfo: Data?
    /// The app's `nonce` from its authorization request.
    public var appNonce: String?
    /// Who signed in, as the upstream's validated ID token says (OpenID Connect upstreams).
    public var subject: String?
    /// The DPoP key (RFC 7638 thumbprint) an in-app sign-in was bound to: the token request must
    /// prove the same key (draft-ietf-oauth-first-party-apps §9.4.1).
    public var dpopJKT: String?

    /// The `redirectURI` of a code from the authorization challenge endpoint: its request had
    /// none, so its token request has none either, and no other code is redeemed without one.
    public static let noRedirectURI = ""

    public init(clientID: String, redirectURI: String, codeChallenge: String, upstream: String, tokenResponse: Data,
                userinfo: Data? = nil, appNonce: String? = nil, subject: String? = nil) {
        self.subject = subject
        self.userinfo = userinfo
        self.appNonce = appNonce
        self.clientID = clientID
        self.redirectURI = redirectURI
        self.codeChallenge = codeChallenge
        self.upstream = upstream
        self.tokenResponse = tokenResponse
    }

    /// Encrypts the value under a key derived from `code`.
    public func sealed(with code: String) throws -> Data {
        try TokenSeal.seal(JSONEncoder().encode(self), with: code, purpose: "gatehouse issued-code v1")
    }

    /// Decrypts a value sealed with `code`; throws when the code is not the one that sealed it.
    public static func unsealed(_ data: Data, with code: String) throws -> IssuedCode {
        try JSONDecoder().decode(IssuedCode.self, from: TokenSeal.open(data, with: code, purpose: "gatehouse issued-code v1"))
    }
}
