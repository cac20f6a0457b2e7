extension GatehouseConfiguration {
    static let httpMethods: Set<String> = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
    static let builtInSources: Set<String> = ["subject", "bpid", "scopes"]

    static func decodeIdentity(_ map: MappingReader) -> IdentitySettings? {
        let kind = map.choice("kind", default: IdentitySettings.Kind.personalInformation)
        let local = kind == .session || kind == .gatehouse
        let url = local ? "" : map.string(kind == .jwt ? "jwks_url" : "url", required: true)
        if !local, let url, let problem = problemWithEndpoint(url) {
            map.reader.report(map.childPath(kind == .jwt ? "jwks_url" : "url"), map.node, problem)
        }
        var settings = IdentitySettings(kind: kind, url: url ?? "")
        if kind == .personalInformation {
            settings.method = map.string("method")?.uppercased() ?? "GET"
            if !["GET", "POST"].contains(settings.method) {
                map.reader.report(map.childPath("method"), map.value("method"), "must be GET or POST")
            }
            settings.format = map.choice("format", default: IdentitySettings.Format.json)
            settings.tokenPlacement = decodePlacement(map)
        }
        let pathKind = settings.format == .xml ? "an element path such as /Response/BPId" : "a JSON Pointer such as /bpId"
        func path(_ key: String) -> String? {
            guard let text = map.string(key) else { return nil }
            if !text.hasPrefix("/") || (settings.format == .json && JSONPointer(text) == nil) {
                map.reader.report(map.childPath(key), map.value(key), "must be \(pathKind)")
            }
            return text
        }
        settings.subjectPath = path("subject")
        settings.bpidPath = path("bpid")
        settings.scopesPath = path("scopes")
        if let attributes = map.namedMapping("attributes") {
            for key in attributeKeys(attributes) {
                if builtInSources.contains(key) {
                    attributes.reader.report(attributes.childPath(key), attributes.node, "'\(key)' is built in; choose another name")
                }
                if let text = attributes.string(key, required: true) { settings.attributePaths[key] = text }
            }
            attributes.finish()
        }
        if kind == .jwt {
            settings.issuer = map.string("issuer", required: true)
            settings.audience = map.string("audience")
            settings.algorithms = map.stringList("algorithms") ?? ["RS256"]
            // The algorithms the shared JOSE verifier checks (GatehouseUpstreams/JOSE).
            let known: Set<String> = ["RS256", "ES256"]
            if let bad = settings.algorithms.first(where: { !known.contains($0) }) {
                map.reader.report(map.childPath("algorithms"), map.value("algorithms"), "'\(bad)' is not an accepted asymmetric algorithm")
            }
        }
        settings.cacheTTL = map.duration("cache_ttl", in: .seconds(0)...(.seconds(86400))) ?? settings.cacheTTL
        settings.negativeTTL = map.duration("negative_ttl", in: .seconds(0)...(.seconds(3600))) ?? settings.negativeTTL
        settings.timeout = map.duration("timeout", in: .milliseconds(10)...(.seconds(60))) ?? settings.timeout
        map.finish()
        return url == nil ? nil : settings
    }

    private static func decodePlacement(_ map: MappingReader) -> IdentitySettings.TokenPlacement {
        guard let text = map.string("token_placement") else { return .bearer }
        let parts = text.split(separator: ":", maxSplits: 1).map(String.init)
        switch (parts.first, parts.count) {
        case ("bearer", 1): return .bearer
        case ("query", 2): return .query(parts[1])
        case ("form", 2): return .form(parts[1])
        default:
            map.reader.report(map.childPath("token_placement"), map.value("token_placement"),
                              "must be bearer, query:PARAMETER or form:PARAMETER")
            return .bearer
        }
    }

    static func decodeRoute(_ map: MappingReader, secrets: SecretLookup, upstreams: [String: UpstreamSettings], names: Set<String>,
                            clients: [String: AppClient]) -> RouteSettings? {
        let prefix = map.string("prefix", required: true)
        if let prefix, !prefix.hasPrefix("/") || prefix.contains("?") || prefix.contains("#") || prefix.contains("..")
            || prefix.hasPrefix("/oauth") || prefix.hasPrefix("/.well-known") || ["/", "/healthz", "/readyz"].contains(prefix) || prefix.hasPrefix("/userinfo")
            || prefix == ForwardAuthSettings.path || prefix.hasPrefix(ForwardAuthSettings.path + "/")
        {
            map.reader.report(map.childPath("prefix"), map.value("prefix"),
                              "must be a path such as /api/contracts, not /, and not under /oauth, /userinfo, /forward-auth or /.well-known")
        }
        let backend = endpoint("backend", in: map)
        let methods = Set((map.stringList("methods") ?? ["GET", "HEAD"]).map { $0.uppercased() })
        if let bad = methods.first(where: { !httpMethods.contains($0) }) {
            map.reader.report(map.childPath("methods"), map.value("methods"), "'\(bad)' is not a method Gatehouse relays")
        }
        let upstreamName = map.string("upstream", required: true)
        var identity: IdentitySettings?
        if let upstreamName {
            if !names.contains(upstreamName) {
                map.reader.report(map.childPath("upstream"), map.value("upstream"), "names no upstream in 'upstreams'")
            } else if let upstream = upstreams[upstreamName] {
                identity = upstream.identity
                if identity == nil {
                    map.reader.report(map.childPath("upstream"), map.value("upstream"),
                                      "the upstream '\(upstreamName)' has no 'identity' to check tokens with")
                }
            }
        }
        var rule = RouteRule()
        if let require = map.mapping("require") {
            rule.scopes = Set(require.stringList("scopes") ?? [])
            if let attributes = require.namedMapping("attributes") {
                for key in attributeKeys(attributes) {
                    if let value = attributes.string(key, required: true) { rule.attributes[key] = value }
                }
                attributes.finish()
            }
            require.finish()
        }
        if let identity, !rule.scopes.isEmpty, !identity.reportsScopes {
            map.reader.report(map.childPath("require.scopes"), map.node,
                              "the upstream's identity (\(identity.kind.rawValue)) reports no scopes; configure identity.scopes or drop the requirement")
        }
        var headers: [(name: String, source: String)] = []
        if let headerMap = map.namedMapping("identity_headers") {
            for name in attributeKeys(headerMap) {
                guard let source = headerMap.string(name, required: true) else { continue }
                let lower = name.lowercased()
                if !name.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "-") })
                    || ["authorization", "host", "cookie", "content-length", "transfer-encoding", "connection"].contains(lower)
                {
                    headerMap.reader.report(headerMap.childPath(name), headerMap.node, "is not a header Gatehouse may set")
                }
                if let identity, !builtInSources.contains(source), identity.attributePaths[source] == nil {
                    headerMap.reader.report(headerMap.childPath(name), headerMap.node,
                                            "'\(source)' is neither subject, bpid, scopes nor an attribute of the upstream's identity")
                }
                headers.append((name: name, source: source))
            }
            headerMap.finish()
        }
        for (source, _) in rule.attributes where !builtInSources.contains(source) {
            if let identity, identity.attributePaths[source] == nil {
                map.reader.report(map.childPath("require.attributes." + source), map.node,
                                  "is not an attribute of the upstream's identity")
            }
        }
        let authorization = map.choice("authorization", default: BackendAuthorization.remove)
        let timeout = map.duration("timeout", in: .milliseconds(10)...(.seconds(600)))
        let maximumBody = map.integer("max_body_bytes", in: 0...(1 << 40))
        let signIn = map.string("sign_in_client")
        let trustRoots = backendTrustRoots(map, backend: backend, secrets: secrets)
        let acceptSessionCookie = map.bool("accept_session_cookie") ?? false
        if let signIn, clients[signIn] == nil {
            map.reader.report(map.childPath("sign_in_client"), map.value("sign_in_client"), "names no client in 'clients'")
        }
        map.finish()
        guard let prefix, let backend, let upstreamName else { return nil }
        let defaultClient = clients.values.filter { $0.upstream == upstreamName }.map(\.clientID).sorted()
        var route = RouteSettings(
            prefix: prefix, backend: backend.hasSuffix("/") ? String(backend.dropLast()) : backend, methods: methods,
            upstream: upstreamName, rule: rule, identityHeaders: headers, authorization: authorization,
            timeout: timeout ?? .seconds(30), maximumBodyBytes: maximumBody ?? 10 * 1024 * 1024,
            signInClientID: signIn ?? (defaultClient.count == 1 ? defaultClient[0] : nil), backendTrustRootsPEM: trustRoots)
        route.acceptSessionCookie = acceptSessionCookie
        return route
    }

    /// `backend_ca_file`: the PEM certificates an https backend is checked against instead of the
    /// system's roots (a private CA, a self-signed backend). Read once, here, like the other files
    /// the configuration names (relative to its folder; a reload refuses a changed one), so a file
    /// that cannot be read or holds no certificate is a configuration problem, not a 502 later.
    private static func backendTrustRoots(_ map: MappingReader, backend: String?, secrets: SecretLookup) -> String? {
        guard let path = map.string("backend_ca_file") else { return nil }
        guard let backend, backend.hasPrefix("https://") else {
            map.reader.report(map.childPath("backend_ca_file"), map.value("backend_ca_file"), "applies only to an https:// backend")
            return nil
        }
        return certificatesFile("backend_ca_file", path: path, in: map, secrets: secrets)
    }

    /// The content of the PEM certificates file `path` that `key` names, read once like the other
    /// files the configuration names; a file that cannot be read or holds no certificate is a
    /// problem at `key`.
    static func certificatesFile(_ key: String, path: String, in map: MappingReader, secrets: SecretLookup) -> String? {
        guard let pem = try? secrets.readFile(path) else {
            map.reader.report(map.childPath(key), map.value(key), "cannot read the file \(path)")
            return nil
        }
        guard pem.contains("-----BEGIN CERTIFICATE-----") else {
            map.reader.report(map.childPath(key), map.value(key), "holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
            return nil
        }
        return pem
    }

    static func decodeIdentityCache(_ map: MappingReader) -> IdentityCacheSettings {
        let settings = IdentityCacheSettings(maximumEntries: map.integer("max_entries", in: 1...50_000_000) ?? 100_000)
        map.finish()
        return settings
    }

    private static func attributeKeys(_ map: MappingReader) -> [String] {
        guard case .mapping(let entries, _) = map.node else { return [] }
        return entries.map(\.key)
    }
}
