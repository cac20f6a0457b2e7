public import Foundation

/// Everything Gatehouse is told to do, validated. Built by `GatehouseConfiguration.decode`.
public struct GatehouseConfiguration: Sendable {
    public var server: ServerSettings
    public var store: StoreSettings
    public var upstreams: [String: UpstreamSettings]
    public var clients: [String: AppClient]
    /// Relayed prefixes, longest first.
    public var routes: [RouteSettings]
    public var identityCache: IdentityCacheSettings
    /// Present when any client is sealed (or a `sessions:` section is given).
    public var sessions: SessionSettings?
    /// Metrics, traces, audit and rate limits.
    public var operations: OperationsSettings
    /// The SMTP relay of manual certification codes.
    public var mail: MailSettings?
    /// Web sessions opened in webviews by session codes.
    public var webviews: WebviewSettings?
    /// How DPoP proofs are checked.
    public var dpop: DPoPSettings = DPoPSettings()
    /// The in-app sign-in dialogue (`in_app_sign_in:`), for apps with `in_app_sign_in: on`.
    public var inAppSignIn: InAppSignInSettings = InAppSignInSettings()
    /// The decision endpoint for the team's own ingress (`forward_auth:`); `nil`: none.
    public var forwardAuth: ForwardAuthSettings?

    /// Whether any app may sign in at the authorization challenge endpoint.
    public var offersInAppSignIn: Bool { clients.values.contains { $0.inAppSignIn == .on } }

    public init(server: ServerSettings, store: StoreSettings, upstreams: [String: UpstreamSettings], clients: [String: AppClient],
                routes: [RouteSettings] = [], identityCache: IdentityCacheSettings = IdentityCacheSettings(),
                sessions: SessionSettings? = nil, operations: OperationsSettings = OperationsSettings()) {
        self.operations = operations
        self.server = server
        self.store = store
        self.upstreams = upstreams
        self.clients = clients
        self.routes = routes.sorted { $0.prefix.count > $1.prefix.count }
        self.identityCache = identityCache
        self.sessions = sessions
    }

    /// The route owning `path`: the longest matching prefix.
    ///
    /// Path parameters (`;…` up to the next `/`) are left out of the match, as servlet
    /// containers leave them out: `/api/admin;x/users` is matched as `/api/admin/users`, so it
    /// can never slip past a stricter route to a looser one (the relay then refuses it, since its
    /// raw bytes are not under the prefix).
    public func route(for path: String) -> RouteSettings? {
        routeIndex(for: path).map { routes[$0] }
    }

    /// The position in `routes` of the route that owns `path` (path parameters, `;…`, ignored).
    public func routeIndex(for path: String) -> Int? {
        guard path.utf8.contains(UInt8(ascii: ";")) else { return routes.firstIndex { $0.owns(path) } }
        var stripped = ""
        var inParameters = false
        for character in path {
            if character == ";" { inParameters = true } else if character == "/" { inParameters = false }
            if !inParameters { stripped.append(character) }
        }
        return routes.firstIndex { $0.owns(stripped) }
    }
}

/// Where Gatehouse listens and how it names itself.
public struct ServerSettings: Sendable {
    /// The issuer (RFC 8414 §2) and base of every URL Gatehouse hands out; no trailing slash.
    public var publicBaseURL: String
    public var host: String
    public var port: Int
    /// Lifetime of an authorization transaction (at most 10 minutes).
    public var transactionLifetime: Duration
    /// Lifetime of a Gatehouse authorization code (at most 60 seconds).
    public var codeLifetime: Duration
    /// Largest request body the OAuth endpoints read.
    public var maximumBodyBytes: Int
    /// How long Gatehouse waits for a TCP/TLS connection to any upstream.
    public var upstreamConnectTimeout: Duration
    /// The PEM of Gatehouse's ES256 signing key (`signing_key_file`); generated at start when absent.
    public var signingKey: Secret?
    /// How long a client has to send a whole request head, from the connection's opening or
    /// from the first byte after an idle keep-alive period (nginx `client_header_timeout`).
    public var headerReadTimeout: Duration = .seconds(30)
    /// The longest silence between two parts of a request body (nginx `client_body_timeout`).
    public var bodyReadTimeout: Duration = .seconds(60)
    /// How long a keep-alive connection may sit idle between requests (nginx `keepalive_timeout`).
    public var idleTimeout: Duration = .seconds(75)
    /// Open client connections per process; beyond, a new connection is answered 503 and closed.
    public var maximumConnections: Int = 4096
    /// After SIGTERM: how long `/readyz` answers 503 while requests are still served (load balancers
    /// take the instance out), before the listener closes. 0 by default (no load balancer to tell);
    /// behind one, set it to its health-check period (the Kubernetes example uses 5 s).
    public var shutdownDrain: Duration = .zero
    /// Then: how long in-flight requests have to finish before their connections are closed.
    public var shutdownTimeout: Duration = .seconds(25)

    public init(publicBaseURL: String, host: String = "127.0.0.1", port: Int = 8080,
                transactionLifetime: Duration = .seconds(600), codeLifetime: Duration = .seconds(60),
                maximumBodyBytes: Int = 16 * 1024, upstreamConnectTimeout: Duration = .seconds(2)) {
        self.publicBaseURL = publicBaseURL
        self.host = host
        self.port = port
        self.transactionLifetime = transactionLifetime
        self.codeLifetime = codeLifetime
        self.maximumBodyBytes = maximumBodyBytes
        self.upstreamConnectTimeout = upstreamConnectTimeout
    }

    public var callbackURL: String { publicBaseURL + "/oauth/callback" }
}

/// Where durable state lives: one SQLite file (one instance), or PostgreSQL (several).
public struct StoreSettings: Sendable {
    /// Path of the SQLite file (created when missing), when `postgres` is `nil`.
    public var sqlitePath: String
    /// The shared PostgreSQL database, for several Gatehouse instances.
    public var postgres: PostgresSettings?
    /// How often expired transactions, codes, tokens and sessions are deleted.
    public var sweepInterval: Duration

    public init(sqlitePath: String, postgres: PostgresSettings? = nil, sweepInterval: Duration = .seconds(60)) {
        self.sqlitePath = sqlitePath
        self.postgres = postgres
        self.sweepInterval = sweepInterval
    }
}

/// The PostgreSQL database Gatehouse instances share (`store.postgres`): one server (`host`,
/// `port`), or several (`hosts`), of which Gatehouse writes to the first that accepts writes
/// (libpq's `target_session_attrs=read-write`).
public struct PostgresSettings: Sendable {
    /// The servers, in the order they are tried; never empty.
    public var hosts: [PostgresEndpoint]
    public var database: String
    public var username: String
    public var password: Secret?
    public var poolSize: Int
    /// TLS toward the database: `disable`, or `require` (certificate and host name verified).
    public var tls: PostgresTLS
    /// PEM file of the CA that signed the server's certificate (default: the system's roots).
    public var caFile: String?

    public enum PostgresTLS: String, Sendable, CaseIterable { case disable, require }

    public init(hosts: [PostgresEndpoint], database: String, username: String, password: Secret?, poolSize: Int = 16,
                tls: PostgresTLS = .require, caFile: String? = nil) {
        precondition(!hosts.isEmpty, "a PostgreSQL store needs a server")
        self.hosts = hosts
        self.tls = tls
        self.caFile = caFile
        self.database = database
        self.username = username
        self.password = password
        self.poolSize = poolSize
    }

    public init(host: String, port: Int = 5432, database: String, username: String, password: Secret?, poolSize: Int = 16,
                tls: PostgresTLS = .require, caFile: String? = nil) {
        self.init(hosts: [PostgresEndpoint(host: host, port: port)], database: database, username: username, password: password,
                  poolSize: poolSize, tls: tls, caFile: caFile)
    }
}

/// One PostgreSQL server: `HOST`, `HOST:PORT` or `[IPv6]:PORT` (5432 when no port is given).
public struct PostgresEndpoint: Sendable, Equatable, CustomStringConvertible {
    public var host: String
    public var port: Int

    public init(host: String, port: Int = 5432) {
        self.host = host
        self.port = port
    }

    public init?(_ text: String) {
        var host = Substring(text)
        var port = 5432
        if host.hasPrefix("[") {
            guard let close = host.firstIndex(of: "]") else { return nil }
            let rest = host[host.index(after: close)...]
            host = host[host.index(after: host.startIndex)..<close]
            if !rest.isEmpty {
                guard rest.hasPrefix(":"), let value = Int(rest.dropFirst()) else { return nil }
                port = value
            }
        } else if let colon = host.lastIndex(of: ":") {
            guard host.firstIndex(of: ":") == colon, let value = Int(host[host.index(after: colon)...]) else { return nil }
            port = value
            host = host[..<colon]
        }
        guard !host.isEmpty, (1...65535).contains(port), !host.contains(where: { $0.isWhitespace || $0 == "/" }) else { return nil }
        self.host = String(host)
        self.port = port
    }

    public var description: String { host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)" }
}

/// How Gatehouse proves itself to an upstream token endpoint.
public enum ClientAuthentication: String, Sendable, CaseIterable {
    /// HTTP Basic with the form-encoded client id and secret (RFC 6749 §2.3.1).
    case clientSecretBasic = "client_secret_basic"
    /// `client_id` and `client_secret` in the form body (RFC 6749 §2.3.1).
    case clientSecretPost = "client_secret_post"
    /// A JWT signed with Gatehouse's key (`client_assertion`, RFC 7523 §2.2, OpenID Connect Core §9).
    case privateKeyJWT = "private_key_jwt"
    /// A client certificate a CA the upstream trusts issued, on the TLS connection (RFC 8705 §2.1).
    case tlsClientAuth = "tls_client_auth"
    /// A self-signed client certificate registered with the upstream, on the TLS connection (RFC 8705 §2.2).
    case selfSignedTLSClientAuth = "self_signed_tls_client_auth"
}

/// What one kind of upstream needs beyond the settings every upstream has: its endpoints,
/// its discovery, its presets. Each kind defines and decodes its own, in its own folder of
/// GatehouseUpstreams (`UpstreamRegistry` maps the `kind:` word to it).
public protocol UpstreamProfileSettings: Sendable {
    /// Whether Gatehouse mints the app's tokens itself (the upstream gives none the app may
    /// use): its apps must be sealed and in callback mode.
    var mintsTokens: Bool { get }
    /// How the relay checks the access tokens Gatehouse mints for this upstream (`identity.kind:
    /// gatehouse`): its own keys, issuer and audience; `nil` when it mints none.
    var mintedTokens: MintedTokenVerification? { get }
    /// App clients the kind's settings name (`app_api.client`), with their YAML key: each must
    /// exist and use this upstream.
    var namedClients: [(key: String, clientID: String)] { get }
    /// Path prefixes the kind's own endpoints are served under (`app_api.path`), with their YAML key:
    /// no two upstreams may share one, and no relayed route may cover one.
    var servedPaths: [(key: String, path: String)] { get }
    /// The upstream's issuer identifier, when it has one: the default `aud` of client assertions.
    var issuerIdentifier: String? { get }
    /// The token endpoint when the configuration names it (not discovered): the `aud` of client
    /// assertions sent elsewhere (introspection) when `audience: token_endpoint`.
    var configuredTokenEndpoint: String? { get }
}

extension UpstreamProfileSettings {
    public var mintsTokens: Bool { false }
    public var mintedTokens: MintedTokenVerification? { nil }
    public var namedClients: [(key: String, clientID: String)] { [] }
    public var servedPaths: [(key: String, path: String)] { [] }
    public var issuerIdentifier: String? { nil }
    public var configuredTokenEndpoint: String? { nil }
}

/// The keys, issuer and audience of access tokens Gatehouse mints (RS256 JWTs): the relay
/// validates them in process, never fetching a key set.
public struct MintedTokenVerification: Sendable {
    public var issuer: String
    public var audience: String
    /// The public keys as a JWK Set document.
    public var jwksDocument: Data

    public init(issuer: String, audience: String, jwksDocument: Data) {
        self.issuer = issuer
        self.audience = audience
        self.jwksDocument = jwksDocument
    }
}

/// An authorization server Gatehouse is a confidential client of: what every kind shares,
/// and the kind's own settings in `profile`.
public struct UpstreamSettings: Sendable {
    public var name: String
    /// The `kind:` word (one of `UpstreamRegistry`'s).
    public var kind: String
    public var clientID: String
    public var clientSecret: Secret
    public var clientAuthentication: ClientAuthentication
    /// Scopes asked for when the app asks for none.
    public var scopes: [String]
    /// How the upstream's access tokens are turned into a caller identity, for relayed routes.
    public var identity: IdentitySettings?
    /// Deadline for one whole exchange with the upstream (connect, send, answer).
    public var timeout: Duration
    /// Whether a refresh token may be sent twice (`reusable`) or is spent by its first use
    /// (`single_use`, the default): then a refresh whose outcome is unknown is never retried.
    public var refreshTokenPolicy: RefreshTokenPolicy
    /// The kind's own settings (endpoints, discovery, presets).
    public var profile: any UpstreamProfileSettings
    /// `private_key_jwt`'s keys and claims (`client_assertion`).
    public var clientAssertion: ClientAssertionSettings?
    /// `tls_client_auth`'s or `self_signed_tls_client_auth`'s certificate (`client_certificate`).
    public var clientCertificate: ClientCertificate?
    /// `ca_file`'s content: the certificates the upstream's TLS certificate is checked against
    /// instead of the system's roots (a private CA).
    public var trustRootsPEM: String?
    /// Whether the authorization request is pushed first (RFC 9126).
    public var pushedAuthorization: PushedAuthorizationPolicy = .auto

    public init(name: String, kind: String, clientID: String, clientSecret: Secret,
                clientAuthentication: ClientAuthentication = .clientSecretBasic, scopes: [String] = [],
                identity: IdentitySettings? = nil, timeout: Duration = .seconds(10), refreshTokenPolicy: RefreshTokenPolicy = .singleUse,
                profile: any UpstreamProfileSettings) {
        self.name = name
        self.kind = kind
        self.clientID = clientID
        self.clientSecret = clientSecret
        self.clientAuthentication = clientAuthentication
        self.scopes = scopes
        self.identity = identity
        self.timeout = timeout
        self.refreshTokenPolicy = refreshTokenPolicy
        self.profile = profile
    }
}

extension UpstreamSettings {
    /// Where Gatehouse publishes the public keys it authenticates to this upstream with (the
    /// `private_key_jwt` keys, or the self-signed certificate), for an upstream that reads them
    /// from a `jwks_uri`; `nil` when it authenticates with nothing public.
    public var publishedKeysPath: String? {
        switch clientAuthentication {
        case .privateKeyJWT, .selfSignedTLSClientAuth: "/upstreams/\(name)/jwks.json"
        default: nil
        }
    }

    /// The keys published at `publishedKeysPath`: public members only (a certificate's without its `x5c`).
    public var publishedKeys: [[String: String]] {
        switch clientAuthentication {
        case .privateKeyJWT: clientAssertion?.keys.map(\.publicJWK) ?? []
        case .selfSignedTLSClientAuth: clientCertificate?.publicJWK.map { [$0] } ?? []
        default: []
        }
    }

    /// The JWK Set document published at `publishedKeysPath` (RFC 7517 §5), a self-signed
    /// certificate's JWK with its `x5c`.
    public var publishedKeysDocument: Data {
        let keys: [[String: Any]] = publishedKeys.map { jwk in
            guard clientAuthentication == .selfSignedTLSClientAuth, let certificate = clientCertificate else { return jwk }
            var withChain: [String: Any] = jwk
            withChain["x5c"] = [certificate.certificateBase64]
            return withChain
        }
        // Strings and arrays of strings only: always serialisable.
        return (try? JSONSerialization.data(withJSONObject: ["keys": keys], options: [.sortedKeys, .withoutEscapingSlashes])) ?? Data()
    }

    /// How long one instance may hold the right to refresh a token: three timeouts and 2 s, at
    /// least 3 s, well past its longest refresh (retries start within the timeout and the last
    /// attempt may take a whole one: under two timeouts). Another instance takes over only once it
    /// has run out, so a holder that dies (kill -9) delays a refresh by this much.
    public var refreshLeaseSeconds: Double { max(3, 3 * timeout.inSeconds + 2) }
}

/// How an upstream treats a refresh token once used (`upstreams[].refresh_token_policy`).
public enum RefreshTokenPolicy: String, Sendable, CaseIterable {
    /// Spent by its first use (rotating, as most legacy servers and RFC 9700 public-client
    /// rules do): a refresh is retried only when it provably never reached the upstream.
    case singleUse = "single_use"
    /// Usable again: a refresh whose outcome is unknown may be retried.
    case reusable
}

/// How an upstream returns the browser after sign-in (see DESIGN.md).
public enum UpstreamWiring: String, Sendable, CaseIterable {
    /// The upstream redirects to Gatehouse's `/oauth/callback`; Gatehouse issues its own code.
    case callback
    /// The upstream redirects straight to the app; the app posts the upstream code and state to `/oauth/token`.
    case relay
}

/// What the app receives from the token endpoint.
public enum TokenExposure: String, Sendable, CaseIterable {
    /// Gatehouse's own short-lived access token and rotating refresh token; the upstream
    /// tokens stay sealed in the session store (the default).
    case sealed
    /// The upstream's token response as it is (today's contract of legacy mobile APIs).
    case passthrough
}

/// Sealed sessions: Gatehouse's own tokens and the keys that seal upstream tokens (`sessions:`).
public struct SessionSettings: Sendable {
    public var keyRing: KeyRing
    public var accessTokenLifetime: Duration
    public var refreshTokenLifetime: Duration
    /// How long a just-replaced refresh token still answers with the pair that replaced it.
    public var refreshGrace: Duration
    /// How long before the upstream access token expires Gatehouse refreshes it.
    public var upstreamRefreshSkew: Duration

    public init(keyRing: KeyRing, accessTokenLifetime: Duration = .seconds(300), refreshTokenLifetime: Duration = .seconds(30 * 86400),
                refreshGrace: Duration = .seconds(30), upstreamRefreshSkew: Duration = .seconds(60)) {
        self.keyRing = keyRing
        self.accessTokenLifetime = accessTokenLifetime
        self.refreshTokenLifetime = refreshTokenLifetime
        self.refreshGrace = refreshGrace
        self.upstreamRefreshSkew = upstreamRefreshSkew
    }
}

/// A native app registered with Gatehouse: a public client (RFC 6749 §2.1) with no secret.
public struct AppClient: Sendable {
    public var clientID: String
    public var upstream: String
    public var wiring: UpstreamWiring
    public var tokenExposure: TokenExposure
    public var redirectURIs: [RedirectURI]
    /// Scopes the app may ask for; when it asks for none it gets all of them.
    public var scopes: [String]
    /// Where `/oauth/logout` may send the browser back to (OpenID Connect RP-Initiated Logout §3).
    public var postLogoutRedirectURIs: [RedirectURI]
    /// Whether the app's tokens are bound to its DPoP key.
    public var dpop: DPoPPolicy = .optional
    /// Present when each install registers itself as an instance (`POST /oauth/register`).
    public var instances: InstanceSettings?
    /// Passthrough apps: what becomes of a refresh token Gatehouse never handed out nor saw refreshed.
    public var unknownRefreshTokens: UnknownRefreshTokens = .forward
    /// Whether the app may sign its user in without a browser (the authorization challenge endpoint).
    public var inAppSignIn: InAppSignInPolicy = .off

    /// Whether this is a registered instance of the app rather than the app's own client id.
    public var isInstance: Bool { InstanceID.split(clientID) != nil && instances != nil }

    public init(clientID: String, upstream: String, wiring: UpstreamWiring = .callback,
                tokenExposure: TokenExposure = .sealed, redirectURIs: [RedirectURI], scopes: [String],
                postLogoutRedirectURIs: [RedirectURI] = []) {
        self.postLogoutRedirectURIs = postLogoutRedirectURIs
        self.clientID = clientID
        self.upstream = upstream
        self.wiring = wiring
        self.tokenExposure = tokenExposure
        self.redirectURIs = redirectURIs
        self.scopes = scopes
    }

    /// The registration that matches a presented redirect URI, if any.
    public func registeredRedirect(matching presented: String) -> RedirectURI? {
        redirectURIs.first { $0.matches(presented) }
    }

    /// The post-logout registration that matches a presented URI, if any.
    public func registeredPostLogoutRedirect(matching presented: String) -> RedirectURI? {
        postLogoutRedirectURIs.first { $0.matches(presented) }
    }
}

/// `clients[].unknown_refresh_tokens`, for passthrough apps: a refresh token Gatehouse has no
/// record of (issued before Gatehouse stood in front of the upstream, or made up).
public enum UnknownRefreshTokens: String, Sendable, CaseIterable {
    /// Sent to the upstream, within `rate_limits.unknown_refresh_per_address`: the tokens apps
    /// already hold keep working on the day Gatehouse is put in front of the upstream.
    case forward
    /// Refused without an upstream call: once every app holds tokens it got through Gatehouse.
    case refuse
}
