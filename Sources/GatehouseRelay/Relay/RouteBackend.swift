/// Where a route's backend listens, parsed once from its URL (`http://host:port/base`).
public struct RouteBackend: Hashable, Sendable {
    public let isTLS: Bool
    public let host: String
    public let port: Int
    /// The path the rest of the app's path is appended to (no trailing slash; may be empty).
    public let basePath: String
    /// `scheme://authority`, as configured: the relayed URL is this plus a `RelayTarget`.
    public let origin: String
    /// The pool key of the backend's connections.
    public var key: String { "\(host):\(port)" }

    /// `nil` when `url` is not an absolute http or https URL.
    public init?(url: String) {
        let isTLS: Bool
        if url.hasPrefix("http://") { isTLS = false } else if url.hasPrefix("https://") { isTLS = true } else { return nil }
        let rest = url.dropFirst(isTLS ? 8 : 7)
        let authority = rest.prefix { $0 != "/" && $0 != "?" && $0 != "#" }
        guard !authority.isEmpty else { return nil }
        let path = rest.dropFirst(authority.count)
        var host = String(authority)
        var port = isTLS ? 443 : 80
        if let colon = authority.lastIndex(of: ":"), !authority.hasSuffix("]") {
            guard let parsed = Int(authority[authority.index(after: colon)...]) else { return nil }
            host = String(authority[..<colon])
            port = parsed
        }
        if host.hasPrefix("[") && host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        self.isTLS = isTLS
        self.host = host
        self.port = port
        self.basePath = path.hasSuffix("/") ? String(path.dropLast()) : String(path)
        self.origin = String(url.prefix(url.count - path.count))
    }
}
