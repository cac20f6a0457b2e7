extension GatehouseConfiguration {
    /// Where the configuration reads secrets from: the process environment and files.
    public struct SecretLookup: Sendable {
        public var environment: @Sendable (String) -> String?
        public var readFile: @Sendable (String) throws -> String

        public init(environment: @escaping @Sendable (String) -> String?, readFile: @escaping @Sendable (String) throws -> String) {
            self.environment = environment
            self.readFile = readFile
        }
    }

    /// Validates a configuration document, listing every problem with its path and line.
    ///
    /// Unknown keys are errors. Secrets are read through `secrets`; a secret written inline
    /// is refused.
    public static func decode(_ root: ConfigNode, secrets: SecretLookup, kinds: [String: UpstreamKindDecoder]) throws(ConfigErrors)
        -> GatehouseConfiguration
    {
        let reader = ConfigReader()
        let decoded = decode(root, reader: reader, secrets: secrets, kinds: kinds)
        guard reader.problems.isEmpty, let decoded else {
            throw ConfigErrors(problems: reader.problems.isEmpty
                ? [ConfigProblem(path: "(document)", line: root.line, message: "is not a valid configuration")]
                : reader.problems)
        }
        return decoded
    }

    /// The keys the decoder asked for while reading `root`, whether or not it is valid: what
    /// it accepts in every mapping the document reaches (see `ConfigReader.keysAsked`).
    public static func keysAsked(decoding root: ConfigNode, secrets: SecretLookup, kinds: [String: UpstreamKindDecoder]) -> Set<String> {
        let reader = ConfigReader()
        _ = decode(root, reader: reader, secrets: secrets, kinds: kinds)
        return reader.keysAsked
    }

    private static func decode(_ root: ConfigNode, reader: ConfigReader, secrets: SecretLookup,
                               kinds: [String: UpstreamKindDecoder]) -> GatehouseConfiguration? {
        guard let top = reader.mapping(root, at: "") else { return nil }
        let server = top.mapping("server", required: true).flatMap { decodeServer($0, secrets: secrets) }
        let store = top.mapping("store", required: true).flatMap { decodeStore($0, secrets: secrets) }

        var upstreams: [String: UpstreamSettings] = [:]
        // Names are kept even for upstreams with problems, so clients naming them get no second error.
        var upstreamNames: Set<String> = []
        var upstreamPaths: [String: String] = [:]
        var assertionKeys = AssertionKeyOwners()
        for item in top.list("upstreams", required: true) ?? [] {
            guard let map = reader.mapping(item.node, at: item.path) else { continue }
            if let name = (map.value("name")).flatMap({ reader.string($0, at: item.path + ".name") }),
               !upstreamNames.insert(name).inserted {
                reader.report(item.path + ".name", item.node, "'\(name)' is used by another upstream")
            }
            guard let upstream = decodeUpstream(map, secrets: secrets, kinds: kinds) else { continue }
            upstreams[upstream.name] = upstream
            upstreamPaths[upstream.name] = item.path
            assertionKeys.claim(upstream, at: item, reader: reader)
        }

        var clients: [String: AppClient] = [:]
        for item in top.list("clients", required: true) ?? [] {
            guard let map = reader.mapping(item.node, at: item.path),
                  let client = decodeClient(map, upstreams: upstreams, names: upstreamNames, secrets: secrets) else { continue }
            if clients[client.clientID] != nil {
                reader.report(item.path + ".client_id", item.node, "'\(client.clientID)' is used by another client")
            }
            clients[client.clientID] = client
        }
        for upstream in upstreams.values {
            for (key, clientID) in upstream.profile.namedClients where clients[clientID]?.upstream != upstream.name {
                reader.report((upstreamPaths[upstream.name] ?? "upstreams") + "." + key, root,
                              "'\(clientID)' names no client of this upstream in 'clients'")
            }
            // The kind's own app API signs users in without an instance id: nothing there can check a certification.
            for (key, clientID) in upstream.profile.namedClients where clients[clientID]?.instances?.attestation == .required {
                reader.report((upstreamPaths[upstream.name] ?? "upstreams") + "." + key, root,
                              "'\(clientID)' has instances.attestation: required, which this upstream's own app API cannot enforce "
                                  + "(it signs in without an app instance): use a client without it for the app API")
            }
        }
        var routes: [RouteSettings] = []
        var prefixes: Set<String> = []
        for item in top.list("routes") ?? [] {
            guard let map = reader.mapping(item.node, at: item.path),
                  let route = decodeRoute(map, secrets: secrets, upstreams: upstreams, names: upstreamNames, clients: clients) else { continue }
            if !prefixes.insert(route.prefix).inserted {
                reader.report(item.path + ".prefix", item.node, "'\(route.prefix)' is used by another route")
            }
            routes.append(route)
        }
        var servedBy: [String: String] = [:]
        for upstream in upstreams.values.sorted(by: { $0.name < $1.name }) {
            let published = upstream.publishedKeysPath.map { [(key: "client_auth", path: $0)] } ?? []
            for (key, path) in upstream.profile.servedPaths + published {
                let at = (upstreamPaths[upstream.name] ?? "upstreams") + "." + key
                if let other = servedBy.updateValue(upstream.name, forKey: path) {
                    reader.report(at, root, "'\(path)' is served for the upstream '\(other)' already")
                }
                if let route = routes.first(where: { $0.owns(path) || $0.prefix.hasPrefix(path + "/") }) {
                    reader.report(at, root, "'\(path)' overlaps the relayed route '\(route.prefix)'")
                }
            }
        }
        let cache = top.mapping("identity_cache").map(decodeIdentityCache) ?? IdentityCacheSettings()
        let sessionMap = top.mapping("sessions")
        let sessions = sessionMap.flatMap { decodeSessions($0, secrets: secrets) }
        if sessionMap == nil, let sealed = clients.values.first(where: { $0.tokenExposure == .sealed }) {
            reader.report("sessions", root, "is required: the client '\(sealed.clientID)' is sealed (the default token_exposure); "
                          + "add a sessions section with encryption_keys_file, or set token_exposure: passthrough")
        }
        let operations = decodeOperations(top)
        let mail = top.mapping("mail").flatMap { decodeMail($0, secrets: secrets) }
        let webviews = top.mapping("webviews").flatMap(decodeWebviews)
        let dpop = top.mapping("dpop").map(decodeDPoP) ?? DPoPSettings()
        let inAppSignIn = top.mapping("in_app_sign_in").map(decodeInAppSignIn) ?? InAppSignInSettings()
        let forwardAuth = top.mapping("forward_auth").map(decodeForwardAuth)
        if forwardAuth != nil, routes.isEmpty {
            reader.report("forward_auth", root, "needs routes: a decision is about a route of the relay")
        }
        for client in clients.values.sorted(by: { $0.clientID < $1.clientID }) where client.inAppSignIn == .on {
            if top.value("mail") == nil {
                reader.report("mail", root, "is required: the client '\(client.clientID)' signs in in the app, and e-mails unblock codes")
                break
            }
        }
        for client in clients.values.sorted(by: { $0.clientID < $1.clientID }) where client.instances?.manualCertification == true {
            if top.value("mail") == nil {
                reader.report("mail", root, "is required: the client '\(client.clientID)' certifies instances by e-mailed code")
            }
        }
        for route in routes where route.acceptSessionCookie {
            if top.value("webviews") == nil {
                reader.report("routes", root, "the route '\(route.prefix)' has accept_session_cookie: it needs a webviews section (where session cookies come from)")
            }
        }
        top.finish()
        guard let server, let store else { return nil }
        var configuration = GatehouseConfiguration(server: server, store: store, upstreams: upstreams, clients: clients,
                                                   routes: routes, identityCache: cache, sessions: sessions, operations: operations)
        configuration.mail = mail
        configuration.webviews = webviews
        configuration.dpop = dpop
        configuration.inAppSignIn = inAppSignIn
        configuration.forwardAuth = forwardAuth
        return configuration
    }

    private static func decodeServer(_ map: MappingReader, secrets: SecretLookup) -> ServerSettings? {
        let base = map.string("public_base_url", required: true)
        if let base, let problem = problemWithEndpoint(base) ?? (base.hasSuffix("/") ? "must not end with '/'" : nil) {
            map.reader.report(map.childPath("public_base_url"), map.value("public_base_url"), problem)
        }
        var settings = ServerSettings(publicBaseURL: base ?? "")
        settings.host = map.string("host") ?? settings.host
        settings.port = map.integer("port", in: 0...65535) ?? settings.port
        settings.transactionLifetime = map.duration("transaction_lifetime", in: .seconds(10)...(.seconds(600))) ?? settings.transactionLifetime
        settings.codeLifetime = map.duration("code_lifetime", in: .seconds(5)...(.seconds(60))) ?? settings.codeLifetime
        settings.maximumBodyBytes = map.integer("max_body_bytes", in: 1024...(1024 * 1024)) ?? settings.maximumBodyBytes
        settings.upstreamConnectTimeout = map.duration("upstream_connect_timeout", in: .milliseconds(10)...(.seconds(60)))
            ?? settings.upstreamConnectTimeout
        settings.headerReadTimeout = map.duration("header_read_timeout", in: .milliseconds(100)...(.seconds(300))) ?? settings.headerReadTimeout
        settings.bodyReadTimeout = map.duration("body_read_timeout", in: .milliseconds(100)...(.seconds(3600))) ?? settings.bodyReadTimeout
        settings.idleTimeout = map.duration("idle_timeout", in: .milliseconds(100)...(.seconds(3600))) ?? settings.idleTimeout
        settings.maximumConnections = map.integer("max_connections", in: 1...1_000_000) ?? settings.maximumConnections
        settings.shutdownDrain = map.duration("shutdown_drain", in: .zero...(.seconds(60))) ?? settings.shutdownDrain
        settings.shutdownTimeout = map.duration("shutdown_timeout", in: .seconds(1)...(.seconds(600))) ?? settings.shutdownTimeout
        if let path = map.string("signing_key_file") {
            if let pem = try? secrets.readFile(path), pem.contains("PRIVATE KEY") {
                settings.signingKey = Secret(pem)
            } else {
                map.reader.report(map.childPath("signing_key_file"), map.value("signing_key_file"),
                                  "cannot read a PEM private key from \(path)")
            }
        }
        map.finish()
        return base == nil ? nil : settings
    }

    private static func decodeStore(_ map: MappingReader, secrets: SecretLookup) -> StoreSettings? {
        let path = map.string("sqlite_path")
        let postgres = map.mapping("postgres").flatMap { decodePostgres($0, secrets: secrets) }
        let interval = map.duration("sweep_interval", in: .seconds(1)...(.seconds(3600)))
        if (path == nil) == (map.value("postgres") == nil) {
            map.reader.report(map.childPath("sqlite_path"), map.node, "give either sqlite_path (one instance) or postgres (several instances)")
        }
        map.finish()
        guard path != nil || postgres != nil else { return nil }
        return StoreSettings(sqlitePath: path ?? "", postgres: postgres, sweepInterval: interval ?? .seconds(60))
    }

    private static func decodePostgres(_ map: MappingReader, secrets: SecretLookup) -> PostgresSettings? {
        let host = map.string("host")
        let port = map.integer("port", in: 1...65535) ?? 5432
        var hosts: [PostgresEndpoint]?
        if let list = map.stringList("hosts") {
            let path = map.childPath("hosts")
            hosts = list.compactMap { text in
                guard let endpoint = PostgresEndpoint(text) else {
                    map.reader.report(path, map.value("hosts"), "each host is HOST or HOST:PORT (IPv6 as [ADDRESS]:PORT)")
                    return nil
                }
                return endpoint
            }
            if list.isEmpty { map.reader.report(path, map.value("hosts"), "name at least one host") }
            if host != nil { map.reader.report(path, map.value("hosts"), "give either host (and port) or hosts, not both") }
            if map.value("port") != nil { map.reader.report(map.childPath("port"), map.value("port"), "with hosts, give each host its port (HOST:PORT)") }
        } else if host == nil {
            map.reader.report(map.childPath("host"), map.node, "give host (and port), or hosts for several servers")
        }
        let database = map.string("database", required: true)
        let username = map.string("username", required: true)
        let password = decodePassword(map, secrets: secrets)
        let pool = map.integer("pool_size", in: 1...500) ?? 16
        let endpoints = hosts ?? host.map { [PostgresEndpoint(host: $0, port: port)] } ?? []
        // TLS is required unless every server is on this machine (a loopback host).
        let loopback = !endpoints.isEmpty && endpoints.allSatisfy { ["127.0.0.1", "::1", "localhost"].contains($0.host) }
        let tls = map.choice("tls", default: loopback ? PostgresSettings.PostgresTLS.disable : .require)
        let caFile = map.string("ca_file")
        map.finish()
        guard !endpoints.isEmpty, let database, let username else { return nil }
        return PostgresSettings(hosts: endpoints, database: database, username: username, password: password, poolSize: pool,
                                tls: tls, caFile: caFile)
    }

    /// `password_env` or `password_file` (never `password` inline): the store's or the mail relay's.
    static func decodePassword(_ map: MappingReader, secrets: SecretLookup) -> Secret? {
        if map.refused("password") != nil {
            map.reader.report(map.childPath("password"), map.refused("password"),
                              "secrets are never written in the configuration: use password_env or password_file")
        }
        if let name = map.string("password_env") {
            if let value = secrets.environment(name), !value.isEmpty { return Secret(value) }
            map.reader.report(map.childPath("password_env"), map.value("password_env"), "the environment variable \(name) is not set or empty")
        } else if let path = map.string("password_file") {
            if let value = try? secrets.readFile(path) { return Secret(value.trimmingTrailingNewlines()) }
            map.reader.report(map.childPath("password_file"), map.value("password_file"), "cannot read the file \(path)")
        }
        return nil
    }

    /// Whether an `identity` mapping has an `attributes` key.
    private static func namesAttributes(_ identity: ConfigNode?) -> Bool {
        guard case .mapping(let entries, _)? = identity else { return false }
        return entries.contains { $0.key == "attributes" }
    }

    /// The kinds that do something, as an error message lists them: "a, b or c".
    private static func kindNames(_ kinds: [String: UpstreamKindDecoder], where test: (UpstreamKindDecoder) -> Bool) -> String {
        let names = kinds.filter { test($0.value) }.keys.sorted()
        guard let last = names.last else { return "none known" }
        return names.count == 1 ? last : names.dropLast().joined(separator: ", ") + " or " + last
    }

    /// The settings every upstream shares, then the kind's own (`UpstreamKindDecoder`).
    private static func decodeUpstream(_ map: MappingReader, secrets: SecretLookup, kinds: [String: UpstreamKindDecoder]) -> UpstreamSettings? {
        let name = map.string("name", required: true)
        let kindName = map.string("kind", required: !kinds.values.contains(where: \.isDefault))
            ?? kinds.first(where: \.value.isDefault)?.key ?? ""
        let kind = kinds[kindName]
        if kind == nil, map.value("kind") != nil {
            map.reader.report(map.childPath("kind"), map.value("kind"), "must be one of: \(kinds.keys.sorted().joined(separator: ", "))")
        }
        let clientID = map.string("client_id", required: true)
        let authentication = map.choice("client_auth", default: kind?.defaultClientAuthentication ?? .clientSecretBasic)
        if !authentication.usesSecret, let kind, !kind.acceptsKeyCredentials {
            map.reader.report(map.childPath("client_auth"), map.value("client_auth"),
                              "a \(kindName) upstream authenticates with client_secret_basic or client_secret_post")
        }
        let secret: Secret?
        if kind?.usesClientSecret == false {
            for key in ["client_secret", "client_secret_env", "client_secret_file"] where map.refused(key) != nil {
                map.reader.report(map.childPath(key), map.refused(key), "a \(kindName) upstream has no client secret")
            }
            secret = Secret("")
        } else if !authentication.usesSecret {
            for key in ["client_secret", "client_secret_env", "client_secret_file"] where map.refused(key) != nil {
                map.reader.report(map.childPath(key), map.refused(key),
                                  "a secret and a key for the same upstream: \(authentication.rawValue) sends no secret, so remove \(key)")
            }
            secret = Secret("")
        } else {
            secret = decodeSecret(in: map, secrets: secrets)
        }
        let credentials = decodeClientCredentials(map, authentication: authentication, secrets: secrets)
        let pushed = map.choice("pushed_authorization_requests", default: PushedAuthorizationPolicy.auto)
        if map.value("pushed_authorization_requests") != nil, let kind, !kind.acceptsKeyCredentials {
            map.reader.report(map.childPath("pushed_authorization_requests"), map.value("pushed_authorization_requests"),
                              "a \(kindName) upstream takes no pushed authorization requests")
        }
        let scopes = map.stringList("scopes") ?? kind?.defaultScopes ?? []
        let timeout = map.duration("timeout", in: .milliseconds(10)...(.seconds(120)))
        var identity = map.mapping("identity").flatMap(decodeIdentity) ?? kind?.defaultIdentity
        if identity?.kind == .gatehouse, !Self.namesAttributes(map.value("identity")) {
            // The attributes of the kind's own tokens, unless the configuration names some (or none: `attributes: {}`).
            identity?.attributePaths = kind?.defaultIdentity?.attributePaths ?? [:]
        }
        if identity?.kind == .session, kind?.keepsIdentity == false {
            map.reader.report(map.childPath("identity.kind"), map.value("identity"),
                              "'session' needs an upstream that verifies who signed in (kind \(Self.kindNames(kinds, where: \.keepsIdentity)))")
            identity = nil
        }
        if identity?.kind == .gatehouse, kind?.defaultIdentity?.kind != .gatehouse {
            map.reader.report(map.childPath("identity.kind"), map.value("identity"),
                              "'gatehouse' needs an upstream whose tokens Gatehouse mints (kind \(Self.kindNames(kinds) { $0.defaultIdentity?.kind == .gatehouse }))")
            identity = nil
        }
        let policy = map.choice("refresh_token_policy", default: RefreshTokenPolicy.singleUse)
        let profile = kind?.decode(map, scopes)
        map.finish()
        guard let name, let clientID, let secret, let profile, let credentials else { return nil }
        var settings = UpstreamSettings(
            name: name, kind: kindName, clientID: clientID, clientSecret: secret, clientAuthentication: authentication,
            scopes: scopes, identity: identity, timeout: timeout ?? .seconds(10), refreshTokenPolicy: policy, profile: profile)
        settings.clientAssertion = credentials.assertion
        settings.clientCertificate = credentials.certificate
        settings.trustRootsPEM = credentials.trustRoots
        settings.pushedAuthorization = pushed
        if settings.publishedKeysPath != nil,
           !name.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || "-._".contains($0)) }) || name.allSatisfy({ $0 == "." }) {
            map.reader.report(map.childPath("name"), map.value("name"),
                              "must be letters, digits, '-', '.' or '_', and not dots alone: its keys are published at /upstreams/<name>/jwks.json")
        }
        return settings
    }

    private static func decodeClient(_ map: MappingReader, upstreams: [String: UpstreamSettings], names: Set<String>,
                                     secrets: SecretLookup) -> AppClient? {
        let clientID = map.string("client_id", required: true)
        if let clientID, clientID.contains(InstanceID.separator) {
            map.reader.report(map.childPath("client_id"), map.value("client_id"),
                              "must not hold '\(InstanceID.separator)': it separates an app from its registered instances")
        }
        let upstreamName = map.string("upstream", required: true)
        if let upstreamName, !names.contains(upstreamName) {
            map.reader.report(map.childPath("upstream"), map.value("upstream"), "names no upstream in 'upstreams'")
        }
        let wiring = map.choice("wiring", default: UpstreamWiring.callback)
        let exposure = map.choice("token_exposure", default: TokenExposure.sealed)
        var redirects: [RedirectURI] = []
        for item in map.list("redirect_uris", required: true) ?? [] {
            guard let text = map.reader.string(item.node, at: item.path) else { continue }
            do throws(RedirectURIError) {
                redirects.append(try RedirectURI(registering: text))
            } catch {
                map.reader.report(item.path, item.node, error.description)
            }
        }
        if map.value("redirect_uris") != nil, redirects.isEmpty {
            map.reader.report(map.childPath("redirect_uris"), map.value("redirect_uris"), "must list at least one redirect URI")
        }
        let scopes = map.stringList("scopes")
        var postLogout: [RedirectURI] = []
        for item in map.list("post_logout_redirect_uris") ?? [] {
            guard let text = map.reader.string(item.node, at: item.path) else { continue }
            do throws(RedirectURIError) {
                postLogout.append(try RedirectURI(registering: text))
            } catch {
                map.reader.report(item.path, item.node, error.description)
            }
        }
        if let upstream = upstreamName.flatMap({ upstreams[$0] }), upstream.profile.mintsTokens {
            if exposure != .sealed {
                map.reader.report(map.childPath("token_exposure"), map.value("token_exposure"),
                                  "must be sealed: Gatehouse mints this app's tokens (its upstream is \(upstream.kind))")
            }
            if wiring != .callback {
                map.reader.report(map.childPath("wiring"), map.value("wiring"),
                                  "must be callback: the \(upstream.kind) provider returns the browser to Gatehouse")
            }
        }
        let dpop = map.choice("dpop", default: DPoPPolicy.optional)
        let unknownRefreshTokens = map.choice("unknown_refresh_tokens", default: UnknownRefreshTokens.forward)
        if map.value("unknown_refresh_tokens") != nil, exposure != .passthrough {
            map.reader.report(map.childPath("unknown_refresh_tokens"), map.value("unknown_refresh_tokens"),
                              "applies only with token_exposure: passthrough (a sealed app's refresh tokens are Gatehouse's own)")
        }
        let inAppSignIn = map.choice("in_app_sign_in", default: InAppSignInPolicy.off)
        if inAppSignIn == .on, exposure != .sealed {
            map.reader.report(map.childPath("in_app_sign_in"), map.value("in_app_sign_in"),
                              "needs token_exposure: sealed: a passthrough app would hold the upstream's own tokens for a password it typed, "
                              + "tokens the upstream only gives a confidential client or a browser sign-in")
        }
        let instances = map.mapping("instances").flatMap { decodeInstances($0, secrets: secrets) }
        if let instances {
            if instances.manualCertification, wiring != .callback {
                map.reader.report(map.childPath("instances.manual_certification"), map.value("instances"),
                                  "needs wiring: callback (the sign-in pauses at Gatehouse's callback for the e-mailed code)")
            }
            if exposure != .sealed, dpop != .off, map.value("dpop") != nil {
                map.reader.report(map.childPath("dpop"), map.value("dpop"), "needs token_exposure: sealed (Gatehouse binds its own tokens)")
            }
        } else if exposure != .sealed, map.value("dpop") != nil, dpop != .off {
            map.reader.report(map.childPath("dpop"), map.value("dpop"), "needs token_exposure: sealed (Gatehouse binds its own tokens)")
        }
        map.finish()
        guard let clientID, let upstreamName, let upstream = upstreams[upstreamName] else { return nil }
        var client = AppClient(clientID: clientID, upstream: upstreamName, wiring: wiring, tokenExposure: exposure,
                               redirectURIs: redirects, scopes: scopes ?? upstream.scopes, postLogoutRedirectURIs: postLogout)
        if upstream.profile.mintsTokens, dpop != .off, map.value("dpop") != nil {
            map.reader.report(map.childPath("dpop"), map.value("dpop"),
                              "must be off: the tokens Gatehouse mints for a \(upstream.kind) provider are not bound to a DPoP key yet")
        }
        // Passthrough apps get the upstream's own tokens: nothing of Gatehouse's to bind.
        client.dpop = exposure == .sealed && !upstream.profile.mintsTokens ? dpop : .off
        client.instances = instances
        client.unknownRefreshTokens = unknownRefreshTokens
        client.inAppSignIn = inAppSignIn
        return client
    }

    private static func decodeSecret(in map: MappingReader, secrets: SecretLookup) -> Secret? {
        if map.refused("client_secret") != nil {
            map.reader.report(map.childPath("client_secret"), map.refused("client_secret"),
                              "secrets are never written in the configuration: use client_secret_env or client_secret_file")
        }
        let env = map.string("client_secret_env")
        let file = map.string("client_secret_file")
        switch (env, file) {
        case (let name?, nil):
            guard let value = secrets.environment(name), !value.isEmpty else {
                map.reader.report(map.childPath("client_secret_env"), map.value("client_secret_env"),
                                  "the environment variable \(name) is not set or empty")
                return nil
            }
            return Secret(value)
        case (nil, let path?):
            do {
                let value = try secrets.readFile(path).trimmingTrailingNewlines()
                guard !value.isEmpty else {
                    map.reader.report(map.childPath("client_secret_file"), map.value("client_secret_file"), "the file \(path) is empty")
                    return nil
                }
                return Secret(value)
            } catch {
                map.reader.report(map.childPath("client_secret_file"), map.value("client_secret_file"), "cannot read the file \(path)")
                return nil
            }
        case (nil, nil):
            map.reader.report(map.childPath("client_secret_env"), map.node, "one of client_secret_env or client_secret_file is required")
            return nil
        case (_?, _?):
            map.reader.report(map.childPath("client_secret_file"), map.value("client_secret_file"),
                              "give client_secret_env or client_secret_file, not both")
            return nil
        }
    }

    private static func decodeSessions(_ map: MappingReader, secrets: SecretLookup) -> SessionSettings? {
        var ring: KeyRing?
        if let path = map.string("encryption_keys_file", required: true) {
            do {
                ring = try KeyRing(parsing: try secrets.readFile(path))
            } catch let error as KeyRingError {
                map.reader.report(map.childPath("encryption_keys_file"), map.value("encryption_keys_file"),
                                  "the key file \(path) is not valid: \(error.description) (make one with 'gatehouse keys generate')")
            } catch {
                map.reader.report(map.childPath("encryption_keys_file"), map.value("encryption_keys_file"), "cannot read the file \(path)")
            }
        }
        let access = map.duration("access_token_lifetime", in: .seconds(10)...(.seconds(3600)))
        let refresh = map.duration("refresh_token_lifetime", in: .seconds(60)...(.seconds(365 * 86400)))
        let grace = map.duration("refresh_grace", in: .seconds(0)...(.seconds(300)))
        let skew = map.duration("upstream_refresh_skew", in: .seconds(0)...(.seconds(3600)))
        map.finish()
        guard let ring else { return nil }
        var settings = SessionSettings(keyRing: ring)
        settings.accessTokenLifetime = access ?? settings.accessTokenLifetime
        settings.refreshTokenLifetime = refresh ?? settings.refreshTokenLifetime
        settings.refreshGrace = grace ?? settings.refreshGrace
        settings.upstreamRefreshSkew = skew ?? settings.upstreamRefreshSkew
        return settings
    }

    public static func endpoint(_ key: String, in map: MappingReader) -> String? {
        guard let text = map.string(key, required: true) else { return nil }
        if let problem = problemWithEndpoint(text) {
            map.reader.report(map.childPath(key), map.value(key), problem)
            return nil
        }
        return text
    }

    /// An endpoint is `https://…`, or `http://` on a loopback host (for local set-ups and tests).
    public static func problemWithEndpoint(_ text: String) -> String? {
        let loopbackHosts = ["127.0.0.1", "[::1]", "localhost"]
        let rest: Substring
        if text.hasPrefix("https://") {
            rest = text.dropFirst(8)
        } else if text.hasPrefix("http://") {
            rest = text.dropFirst(7)
            let host = rest.prefix { $0 != "/" && $0 != "?" }.split(separator: ":", maxSplits: 1).first.map(String.init) ?? ""
            let hostWithoutPort = host.hasPrefix("[") ? String(rest.prefix { $0 != "]" }) + "]" : host
            guard loopbackHosts.contains(hostWithoutPort) else {
                return "must be an https URL (plain http is allowed only on a loopback host)"
            }
        } else {
            return "must be an absolute https URL"
        }
        guard !rest.isEmpty, !rest.hasPrefix("/"), !text.contains("#"), !text.contains(" ") else {
            return "must be an absolute URL with a host and no fragment"
        }
        return nil
    }
}

extension String {
    fileprivate func trimmingTrailingNewlines() -> String {
        var text = Substring(self)
        while let last = text.last, last == "\n" || last == "\r" { text = text.dropLast() }
        return String(text)
    }
}

/// How one kind of upstream reads its own settings (registered by kind in `UpstreamRegistry`).
public struct UpstreamKindDecoder: Sendable {
    /// Reads the kind's own keys from the upstream's mapping; `scopes` are the upstream's
    /// effective scopes. Reports problems on the mapping's reader; `nil` when unusable.
    public var decode: @Sendable (_ map: MappingReader, _ scopes: [String]) -> (any UpstreamProfileSettings)?
    /// Scopes asked for when the configuration names none.
    public var defaultScopes: [String]
    /// The identity source when the configuration names none.
    public var defaultIdentity: IdentitySettings?
    /// Whether the kind verifies who signed in at sign-in (so `identity: {kind: session}` works).
    public var keepsIdentity: Bool
    /// How Gatehouse authenticates to the token endpoint when the configuration does not say.
    public var defaultClientAuthentication: ClientAuthentication
    /// Whether the kind takes `client_secret_env`/`client_secret_file` (a kind whose requests
    /// are signed with a key of its own says no).
    public var usesClientSecret: Bool
    /// Whether an upstream without `kind:` is of this kind (one kind at most says so).
    public var isDefault: Bool
    /// Whether the kind may authenticate with a key instead of a secret (`private_key_jwt`, the
    /// two mutual-TLS methods) and push its authorization requests (RFC 9126).
    public var acceptsKeyCredentials = false

    public init(defaultScopes: [String] = [], defaultIdentity: IdentitySettings? = nil, keepsIdentity: Bool = false,
                defaultClientAuthentication: ClientAuthentication = .clientSecretBasic, usesClientSecret: Bool = true,
                isDefault: Bool = false, acceptsKeyCredentials: Bool = false,
                decode: @escaping @Sendable (_ map: MappingReader, _ scopes: [String]) -> (any UpstreamProfileSettings)?) {
        self.isDefault = isDefault
        self.acceptsKeyCredentials = acceptsKeyCredentials
        self.defaultClientAuthentication = defaultClientAuthentication
        self.usesClientSecret = usesClientSecret
        self.decode = decode
        self.defaultScopes = defaultScopes
        self.defaultIdentity = defaultIdentity
        self.keepsIdentity = keepsIdentity
    }
}

/// Which upstream each client-assertion key signs for: one key (by its RFC 7638 thumbprint,
/// whatever file holds it) belongs to one upstream, since an assertion one upstream received could
/// be replayed at the other (the same `iss` and `sub` where the client ids match, and an `aud`
/// of the other's choosing is not Gatehouse's to rule out).
struct AssertionKeyOwners {
    private var owners: [String: (upstream: String, path: String)] = [:]

    /// Records the keys of `upstream`, configured at `item` (`upstreams[i]`), reporting each one
    /// an earlier upstream has already at its own path and line.
    mutating func claim(_ upstream: UpstreamSettings, at item: (node: ConfigNode, path: String), reader: ConfigReader) {
        for (index, key) in (upstream.clientAssertion?.keys ?? []).enumerated() {
            let path = "\(item.path).client_assertion.keys[\(index)]"
            guard let owner = owners[key.thumbprint] else {
                owners[key.thumbprint] = (upstream.name, path)
                continue
            }
            guard owner.upstream != upstream.name else { continue }
            let node = item.node["client_assertion"]?["keys"]?[index]
            reader.report(path, node ?? item.node, "is the key of the upstream '\(owner.upstream)' too (\(owner.path), thumbprint "
                          + "\(key.thumbprint)): each upstream needs a key of its own, or either could replay Gatehouse's assertions at the other")
        }
    }
}
