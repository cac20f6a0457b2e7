/// What an operations team tunes: metrics, traces, the audit stream, rate limits and shutdown.
/// Decoded from `observability` and `rate_limits` (shutdown timing is in `ServerSettings`).
public struct OperationsSettings: Sendable, Equatable {
    /// `/metrics`; `nil`: served nowhere.
    public var metrics: MetricsSettings?
    /// OTLP/HTTP traces; `nil`: off (the default).
    public var tracing: TracingSettings?
    /// Where audit events go; `nil`: standard error, with the logs.
    public var auditFile: String?
    /// Whether each request writes its `request` line (at `info`).
    public var accessLog: AccessLogSetting
    public var rateLimits: RateLimitSettings

    public init(metrics: MetricsSettings? = nil, tracing: TracingSettings? = nil, auditFile: String? = nil,
                accessLog: AccessLogSetting = .on, rateLimits: RateLimitSettings = RateLimitSettings()) {
        self.metrics = metrics
        self.tracing = tracing
        self.auditFile = auditFile
        self.accessLog = accessLog
        self.rateLimits = rateLimits
    }
}

/// `observability.access_log`: one `request` line per request, or none.
public enum AccessLogSetting: String, Sendable, CaseIterable {
    case on
    case off
}

/// `observability.metrics`: a listener of its own, or the public port for some addresses.
public struct MetricsSettings: Sendable, Equatable {
    /// A separate listener that serves `GET /metrics` only.
    public var listenHost: String?
    public var listenPort: Int?
    /// Peers that may read `/metrics` on the public port; empty: never on the public port.
    public var allow: [AddressRange]

    public init(listenHost: String? = nil, listenPort: Int? = nil, allow: [AddressRange] = []) {
        self.listenHost = listenHost
        self.listenPort = listenPort
        self.allow = allow
    }
}

/// `observability.tracing`: OTLP/HTTP (protobuf) export of spans.
public struct TracingSettings: Sendable, Equatable {
    /// The collector's traces URL, e.g. `http://collector:4318/v1/traces`.
    public var endpoint: String
    public var serviceName: String
    /// Share of new traces kept (parent-based: a sampled parent is always followed).
    public var sampleRatio: Double

    public init(endpoint: String, serviceName: String = "gatehouse", sampleRatio: Double = 1) {
        self.endpoint = endpoint
        self.serviceName = serviceName
        self.sampleRatio = sampleRatio
    }
}

/// `rate_limits`: token buckets, in process (each instance counts on its own).
public struct RateLimitSettings: Sendable, Equatable {
    /// Peers whose forwarding header is believed.
    public var trustedProxies: [AddressRange]
    /// The one forwarding header those proxies write (the other is never read).
    public var forwardedHeader: ForwardedHeader = .xForwardedFor
    public var oauthPerClient: BucketSettings?
    public var oauthPerAddress: BucketSettings?
    public var relayPerSubject: BucketSettings?
    /// Identity look-ups (tokens not in the cache) per client address.
    public var identityLookupsPerAddress: BucketSettings?
    /// Identity calls in flight toward each identity service.
    public var identityConcurrency: Int
    /// Instance registrations (`/oauth/register`) per client address and per app: on by default,
    /// so that a default configuration cannot be flooded with instances. `off` in the file: `nil`.
    public var registrationPerAddress: BucketSettings? = BucketSettings(perSecond: 0.1, burst: 20)
    public var registrationPerApp: BucketSettings? = BucketSettings(perSecond: 5, burst: 300)
    /// Refreshes with a refresh token Gatehouse has never seen (passthrough apps), per client
    /// address: each costs an upstream call, so junk cannot be turned into upstream load. On by default.
    public var unknownRefreshPerAddress: BucketSettings? = BucketSettings(perSecond: 0.1, burst: 10)
    /// Requests to the authorization challenge endpoint per client address, and passwords, codes
    /// and e-mails per account (its `login_hint`): on by default (credential stuffing).
    public var inAppPerAddress: BucketSettings? = BucketSettings(perSecond: 0.2, burst: 20)
    public var inAppPerAccount: BucketSettings? = BucketSettings(perSecond: 0.05, burst: 10)

    public init(trustedProxies: [AddressRange] = [], oauthPerClient: BucketSettings? = nil, oauthPerAddress: BucketSettings? = nil,
                relayPerSubject: BucketSettings? = nil, identityLookupsPerAddress: BucketSettings? = nil,
                identityConcurrency: Int = 32) {
        self.trustedProxies = trustedProxies
        self.oauthPerClient = oauthPerClient
        self.oauthPerAddress = oauthPerAddress
        self.relayPerSubject = relayPerSubject
        self.identityLookupsPerAddress = identityLookupsPerAddress
        self.identityConcurrency = identityConcurrency
    }
}

extension RateLimitSettings {
    /// `rate_limits.forwarded_header`.
    public enum ForwardedHeader: String, Sendable, CaseIterable {
        case xForwardedFor = "x-forwarded-for"
        case forwarded
    }
}

/// One token bucket: `burst` requests at once, refilled at `perSecond`.
public struct BucketSettings: Sendable, Equatable {
    public var perSecond: Double
    public var burst: Int

    public init(perSecond: Double, burst: Int) {
        self.perSecond = perSecond
        self.burst = burst
    }
}

extension GatehouseConfiguration {
    static func decodeOperations(_ top: MappingReader) -> OperationsSettings {
        var settings = OperationsSettings()
        if let observability = top.mapping("observability") {
            settings.metrics = observability.mapping("metrics").map(decodeMetrics)
            settings.tracing = observability.mapping("tracing").flatMap(decodeTracing)
            if let audit = observability.mapping("audit") {
                settings.auditFile = audit.string("file")
                audit.finish()
            }
            settings.accessLog = observability.choice("access_log", default: settings.accessLog)
            observability.finish()
        }
        if let limits = top.mapping("rate_limits") {
            settings.rateLimits = decodeRateLimits(limits)
        }
        return settings
    }

    private static func decodeMetrics(_ map: MappingReader) -> MetricsSettings {
        var settings = MetricsSettings()
        if let listen = map.string("listen") {
            if let (host, port) = hostAndPort(listen) {
                settings.listenHost = host
                settings.listenPort = port
            } else {
                map.reader.report(map.childPath("listen"), map.value("listen"), "must be host:port, e.g. 127.0.0.1:9464 or [::1]:9464")
            }
        }
        settings.allow = addressRanges("allow", in: map)
        if map.value("listen") == nil, map.value("allow") == nil {
            map.reader.report(map.path, map.node, "needs listen (a separate listener) or allow (addresses that may read /metrics on the public port)")
        }
        map.finish()
        return settings
    }

    private static func decodeTracing(_ map: MappingReader) -> TracingSettings? {
        let endpoint = map.string("otlp_endpoint", required: true)
        if let endpoint, let problem = problemWithEndpoint(endpoint) {
            map.reader.report(map.childPath("otlp_endpoint"), map.value("otlp_endpoint"), problem)
        }
        var settings = TracingSettings(endpoint: endpoint ?? "")
        settings.serviceName = map.string("service_name") ?? settings.serviceName
        if let node = map.value("sample_ratio"), let text = map.reader.string(node, at: map.childPath("sample_ratio")) {
            if let ratio = Double(text), (0...1).contains(ratio) {
                settings.sampleRatio = ratio
            } else {
                map.reader.report(map.childPath("sample_ratio"), node, "must be a number from 0 to 1")
            }
        }
        map.finish()
        return endpoint == nil ? nil : settings
    }

    private static func decodeRateLimits(_ map: MappingReader) -> RateLimitSettings {
        var settings = RateLimitSettings()
        settings.trustedProxies = addressRanges("trusted_proxies", in: map)
        settings.forwardedHeader = map.choice("forwarded_header", default: settings.forwardedHeader)
        settings.oauthPerClient = bucket("oauth_per_client", in: map)
        settings.oauthPerAddress = bucket("oauth_per_address", in: map)
        settings.relayPerSubject = bucket("relay_per_subject", in: map)
        settings.identityLookupsPerAddress = bucket("identity_lookups_per_address", in: map)
        settings.identityConcurrency = map.integer("identity_concurrency", in: 1...10_000) ?? settings.identityConcurrency
        settings.registrationPerAddress = defaultedBucket("registration_per_address", in: map, default: settings.registrationPerAddress)
        settings.registrationPerApp = defaultedBucket("registration_per_app", in: map, default: settings.registrationPerApp)
        settings.unknownRefreshPerAddress = defaultedBucket("unknown_refresh_per_address", in: map,
                                                            default: settings.unknownRefreshPerAddress)
        settings.inAppPerAddress = defaultedBucket("in_app_per_address", in: map, default: settings.inAppPerAddress)
        settings.inAppPerAccount = defaultedBucket("in_app_per_account", in: map, default: settings.inAppPerAccount)
        map.finish()
        return settings
    }

    /// A limit that is on unless the file says `off`: absent, the default bucket.
    private static func defaultedBucket(_ key: String, in parent: MappingReader, default bucket: BucketSettings?) -> BucketSettings? {
        guard let node = parent.value(key) else { return bucket }
        if case .scalar(let text, _) = node {
            if text != "off", text != "false" { parent.reader.report(parent.childPath(key), node, "must be off, or a mapping with per_second and burst") }
            return nil
        }
        return Self.bucket(key, in: parent)
    }

    private static func bucket(_ key: String, in parent: MappingReader) -> BucketSettings? {
        guard let map = parent.mapping(key) else { return nil }
        var perSecond: Double?
        if let node = map.value("per_second", required: true), let text = map.reader.string(node, at: map.childPath("per_second")) {
            if let rate = Double(text), rate.isFinite, rate > 0, rate <= 1_000_000 {
                perSecond = rate
            } else {
                map.reader.report(map.childPath("per_second"), node, "must be a number above 0 (requests per second), at most 1000000")
            }
        }
        let burst = map.integer("burst", in: 1...1_000_000)
        if map.value("burst") == nil { map.reader.report(map.childPath("burst"), map.node, "is required") }
        map.finish()
        guard let perSecond, let burst else { return nil }
        return BucketSettings(perSecond: perSecond, burst: burst)
    }

    private static func addressRanges(_ key: String, in map: MappingReader) -> [AddressRange] {
        guard let items = map.list(key) else { return [] }
        return items.compactMap { item in
            guard let text = map.reader.string(item.node, at: item.path) else { return nil }
            guard let range = AddressRange(text) else {
                map.reader.report(item.path, item.node, "must be an IP address or a CIDR range such as 10.0.0.0/8 or fd00::/8")
                return nil
            }
            return range
        }
    }

    /// `host:port` or `[v6]:port`.
    static func hostAndPort(_ text: String) -> (String, Int)? {
        let host: Substring
        let portText: Substring
        if text.hasPrefix("[") {
            guard let close = text.firstIndex(of: "]"), text[text.index(after: close)...].hasPrefix(":") else { return nil }
            host = text[text.index(after: text.startIndex)..<close]
            portText = text[text.index(close, offsetBy: 2)...]
        } else {
            guard let colon = text.lastIndex(of: ":") else { return nil }
            host = text[..<colon]
            portText = text[text.index(after: colon)...]
        }
        guard !host.isEmpty, !host.contains(" "), let port = Int(portText), (0...65535).contains(port) else { return nil }
        return (String(host), port)
    }
}

/// `forward_auth`: decisions for the team's own ingress (nginx `auth_request`, ingress-nginx,
/// Caddy `forward_auth`, Traefik `ForwardAuth`, Envoy `ext_authz`), on the relay's routes.
public struct ForwardAuthSettings: Sendable, Equatable {
    /// The endpoint's path; every path under it is Gatehouse's (no route may take it).
    public static let path = "/forward-auth"
    /// The ingress's addresses: the only peers answered, and whose headers are believed.
    public var trustedProxies: [AddressRange]
    /// The revocation bound: the longest an ingress may cache an allow (`Cache-Control: max-age`).
    public var maxAge: Duration = .seconds(5)

    public init(trustedProxies: [AddressRange], maxAge: Duration = .seconds(5)) {
        self.trustedProxies = trustedProxies
        self.maxAge = maxAge
    }

    /// Whether `peer` (the connection's address) is one of `trusted_proxies`.
    public func trusts(_ peer: String?) -> Bool {
        guard let peer else { return false }
        return trustedProxies.contains { $0.contains(peer) }
    }
}

extension GatehouseConfiguration {
    static func decodeForwardAuth(_ map: MappingReader) -> ForwardAuthSettings {
        let trusted = addressRanges("trusted_proxies", in: map)
        if map.value("trusted_proxies") == nil || trusted.isEmpty {
            map.reader.report(map.childPath("trusted_proxies"), map.node,
                              "is required: the addresses of the ingress that asks (nobody else is answered)")
        }
        var settings = ForwardAuthSettings(trustedProxies: trusted)
        settings.maxAge = map.duration("max_age", in: .zero...(.seconds(300))) ?? settings.maxAge
        map.finish()
        return settings
    }
}
