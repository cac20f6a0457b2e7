public import Foundation
public import GatehouseCore
public import Logging

// What a kind contributes to the server beyond the sign-in dialogue of `UpstreamProfile`: how the
// browser carries Gatehouse's state back, whether Gatehouse mints the app's tokens (and how), and
// the endpoints of the kind's own app face. The server asks the profile; no server file names a
// kind, so a new kind is its folder and its line in `UpstreamRegistry`.

/// How the browser comes back from the upstream's sign-in page with Gatehouse's state.
public enum SignInReturn: Sendable, Hashable {
    /// To Gatehouse's callback, with `state` in the query (RFC 6749 §4.1.2).
    case query
    /// To `path`, which the upstream's contract fixes, with no `state`: the authorize route keeps
    /// Gatehouse's state in a `__Secure-` cookie scoped to that path, and the server answers it.
    case cookie(path: String)
}

/// A kind whose upstream only proves who signed in: Gatehouse mints the app's tokens itself,
/// in a session the server keeps (`MintedSessions`). Its apps are sealed, in callback mode.
public protocol TokenMinter: Sendable {
    /// The app's tokens (an RFC 6749 §5.1 body) for a sign-in this upstream completed; `userinfo`
    /// is the grant's, as the profile made it.
    func signedIn(userinfo: Data?, clientID: String, sessions: any MintedSessions) async throws(OAuthError) -> Data
    /// `grant_type=refresh_token` for one of its refresh tokens (an RFC 6749 §5.1 body).
    func refresh(_ refreshToken: String, clientID: String, sessions: any MintedSessions) async throws(OAuthError) -> Data
    /// The store key of a refresh token it minted (its sessions' refresh-token hash), for revocation.
    func refreshTokenHash(_ token: String) -> String
    /// The public keys of the tokens it signs, published in `/.well-known/jwks.json`.
    var publicKeys: [[String: String]] { get }
}

/// The server's sealed sessions, offered to a minting kind: the session record, its refresh-token
/// family (rotation, grace window, reuse detection), the single-use store, the audit stream.
public protocol MintedSessions: Sendable {
    var now: Date { get }
    var audit: AuditLog { get }
    var logger: Logger { get }
    /// Whether `subject` has had a session of `upstream` before.
    func hasSession(subject: String, upstream: String) async throws -> Bool
    /// A new session sealing `userinfo` under the session key ring, begun at `createdAt`; returns its id.
    func begin(subject: String, userinfo: Data, clientID: String, upstream: String, createdAt: Date, expiresAt: Date) async throws -> String
    func recordRefreshToken(hash: String, sessionID: String, expiresAt: Date) async throws
    /// The refresh-token family of a session, as sealed sessions rotate theirs: `issue` makes the
    /// successor for a live session (its opened userinfo given), counted, audited, coalesced within
    /// the grace window; a reuse after it ends the session. Returns the successor's body.
    func rotate(refreshToken: String, hash: String, clientID: String, upstream: String,
                issue: (MintedRotation) async throws(OAuthError) -> MintedSuccessor) async throws(OAuthError) -> Data
    /// Records a value used at most once, on every instance (`SingleUseStore.insertOnce`).
    func insertOnce(kind: String, keyHash: String, expiresAt: Date) async throws -> Bool
}

/// A live session whose refresh token is being swapped.
public struct MintedRotation: Sendable {
    public let sessionID: String
    public let sessionExpiresAt: Date
    /// The userinfo sealed at sign-in.
    public let userinfo: Data
    /// When the presented refresh token expires.
    public let refreshTokenExpiresAt: Date
    public let now: Date

    public init(sessionID: String, sessionExpiresAt: Date, userinfo: Data, refreshTokenExpiresAt: Date, now: Date) {
        self.sessionID = sessionID
        self.sessionExpiresAt = sessionExpiresAt
        self.userinfo = userinfo
        self.refreshTokenExpiresAt = refreshTokenExpiresAt
        self.now = now
    }
}

/// A rotation's new pair: the body the app gets (and a retry within the grace window gets again).
public struct MintedSuccessor: Sendable {
    public let body: Data
    /// The new refresh token's hash, dropped should another request have rotated first.
    public let refreshHash: String
    /// `false` when the presented refresh token stays valid (it is kept, not replaced).
    public let replacesToken: Bool

    public init(body: Data, refreshHash: String, replacesToken: Bool) {
        self.body = body
        self.refreshHash = refreshHash
        self.replacesToken = replacesToken
    }
}

/// One endpoint of a kind's own app face (`POST` at `path`), free of any HTTP framework: the
/// server reads the request, and writes the answer as it is.
public struct AppRoute: Sendable {
    public let path: String
    public let handle: @Sendable (AppRequest, any MintedSessions) async -> AppResponse

    public init(path: String, handle: @escaping @Sendable (AppRequest, any MintedSessions) async -> AppResponse) {
        self.path = path
        self.handle = handle
    }
}

/// A request to an `AppRoute`.
public struct AppRequest: Sendable {
    public let contentType: String?
    /// The whole body; `nil` when it is longer than `limit` bytes.
    public let body: Data?
    public let limit: Int
    /// The client's address as `rate_limits` resolves it (the peer, or what a trusted proxy says).
    public let clientAddress: String?

    public init(contentType: String?, body: Data?, limit: Int, clientAddress: String?) {
        self.contentType = contentType
        self.body = body
        self.limit = limit
        self.clientAddress = clientAddress
    }
}

/// An `AppRoute`'s answer: a JSON body, its status and extra headers.
public struct AppResponse: Sendable {
    public let status: Int
    public let headers: [(name: String, value: String)]
    public let json: Data

    public init(status: Int, headers: [(name: String, value: String)] = [], json: Data) {
        self.status = status
        self.headers = headers
        self.json = json
    }
}
