/// How Gatehouse learns who holds an upstream's access token (per upstream, `identity:`).
public struct IdentitySettings: Sendable {
    public enum Kind: String, Sendable, CaseIterable {
        /// A legacy personal-information service answering JSON or XML (myVOO's GetPersonalInformation).
        case personalInformation = "personal_information"
        /// RFC 7662 token introspection, authenticated with the upstream's client credentials.
        case introspection
        /// OpenID Connect userinfo.
        case userinfo
        /// Local validation of JWT access tokens (RFC 9068) against the upstream's JWKS.
        case jwt
        /// The userinfo the upstream gave at sign-in, verified and kept in the sealed session
        /// (the kinds that verify who signed in): no identity call per request.
        case session
        /// The access tokens Gatehouse itself minted for the upstream (RS256 JWTs),
        /// verified in process with its own keys: no identity call at all.
        case gatehouse
    }

    public enum Format: String, Sendable, CaseIterable { case json, xml }

    /// Where the access token goes in a personal-information request.
    public enum TokenPlacement: Sendable, Equatable {
        case bearer
        case query(String)
        case form(String)
    }

    public var kind: Kind
    /// The service's URL (the JWKS URL for `jwt`).
    public var url: String
    public var method: String
    public var format: Format
    public var tokenPlacement: TokenPlacement
    /// Where each value is found: JSON Pointers for JSON, element paths (`/A/B/C`) for XML.
    public var subjectPath: String?
    public var bpidPath: String?
    public var scopesPath: String?
    public var attributePaths: [String: String]
    /// For `jwt`: the required `iss`, `aud` and accepted algorithms.
    public var issuer: String?
    public var audience: String?
    public var algorithms: [String]
    public var cacheTTL: Duration
    public var negativeTTL: Duration
    public var timeout: Duration

    public init(kind: Kind, url: String, method: String = "GET", format: Format = .json, tokenPlacement: TokenPlacement = .bearer,
                subjectPath: String? = nil, bpidPath: String? = nil, scopesPath: String? = nil, attributePaths: [String: String] = [:],
                issuer: String? = nil, audience: String? = nil, algorithms: [String] = ["RS256"],
                cacheTTL: Duration = .seconds(300), negativeTTL: Duration = .seconds(10), timeout: Duration = .seconds(5)) {
        self.kind = kind
        self.url = url
        self.method = method
        self.format = format
        self.tokenPlacement = tokenPlacement
        self.subjectPath = subjectPath
        self.bpidPath = bpidPath
        self.scopesPath = scopesPath
        self.attributePaths = attributePaths
        self.issuer = issuer
        self.audience = audience
        self.algorithms = algorithms
        self.cacheTTL = cacheTTL
        self.negativeTTL = negativeTTL
        self.timeout = timeout
    }

    /// Whether this identity source reports a token's scopes (needed by routes that require scopes).
    public var reportsScopes: Bool {
        switch kind {
        case .introspection, .jwt: true
        case .personalInformation, .userinfo, .session, .gatehouse: scopesPath != nil
        }
    }
}

/// What Gatehouse does with the app's `Authorization` header toward a backend.
public enum BackendAuthorization: String, Sendable, CaseIterable {
    /// Removed: the backend trusts Gatehouse's identity headers.
    case remove
    /// Sent on as it came.
    case passthrough
    /// Replaced by a short-lived JWT signed by Gatehouse (verifiable from `/.well-known/jwks.json`).
    case assertion
}

/// A path prefix relayed to a backend.
public struct RouteSettings: Sendable {
    public var prefix: String
    /// Base URL the rest of the path is appended to.
    public var backend: String
    public var methods: Set<String>
    /// The upstream whose access tokens this route accepts (and whose identity service resolves them).
    public var upstream: String
    public var rule: RouteRule
    /// Header name → source (`subject`, `bpid`, `scopes` or an attribute name).
    public var identityHeaders: [(name: String, source: String)]
    public var authorization: BackendAuthorization
    /// Time until the backend's response head.
    public var timeout: Duration
    public var maximumBodyBytes: Int
    /// The app client named in 401 answers (where to sign in again).
    public var signInClientID: String?
    /// `backend_ca_file`'s content: the PEM certificates an https backend is checked against
    /// instead of the system's roots.
    public var backendTrustRootsPEM: String?
    /// Whether the web-session cookie of `/session` authenticates a request (`accept_session_cookie`).
    public var acceptSessionCookie: Bool = false

    public init(prefix: String, backend: String, methods: Set<String> = ["GET", "HEAD"], upstream: String,
                rule: RouteRule = RouteRule(), identityHeaders: [(name: String, source: String)] = [],
                authorization: BackendAuthorization = .remove, timeout: Duration = .seconds(30),
                maximumBodyBytes: Int = 10 * 1024 * 1024, signInClientID: String? = nil, backendTrustRootsPEM: String? = nil) {
        self.prefix = prefix
        self.backend = backend
        self.methods = methods
        self.upstream = upstream
        self.rule = rule
        self.identityHeaders = identityHeaders
        self.authorization = authorization
        self.timeout = timeout
        self.maximumBodyBytes = maximumBodyBytes
        self.signInClientID = signInClientID
        self.backendTrustRootsPEM = backendTrustRootsPEM
    }

    /// Whether `path` is this prefix or below it (segment boundary: `/api/a` does not own `/api/ab`).
    public func owns(_ path: String) -> Bool {
        guard path.hasPrefix(prefix) else { return false }
        if prefix.hasSuffix("/") || path.count == prefix.count { return true }
        return path[path.index(path.startIndex, offsetBy: prefix.count)] == "/"
    }
}

/// The identity cache's bounds (top-level `identity_cache:`).
public struct IdentityCacheSettings: Sendable {
    public var maximumEntries: Int

    public init(maximumEntries: Int = 100_000) {
        self.maximumEntries = maximumEntries
    }
}
