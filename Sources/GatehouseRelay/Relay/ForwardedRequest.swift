/// The original request an ingress asks about (nginx `auth_request`, ingress-nginx `auth-url`,
/// Caddy `forward_auth`, Traefik `ForwardAuth`, Envoy's HTTP `ext_authz`), read from the headers
/// each engine's documentation says it sets. Read only from a trusted proxy: the caller checks.
public struct ForwardedRequest: Sendable, Equatable {
    /// The app's method, upper case as sent (`GET`, `POST`…).
    public let method: String
    /// The request target the app sent: path and query, never decoded.
    public let target: String
    /// `https` or `http`: the scheme the app called (DPoP's `htu`).
    public let scheme: String
    /// The host (and port) the app called; `nil` when no header names it.
    public let host: String?

    public init(method: String, target: String, scheme: String, host: String?) {
        self.method = method
        self.target = target
        self.scheme = scheme
        self.host = host
    }

    /// What an engine's request says, by header name (lower case): every value of the field.
    public typealias Fields = (String) -> [String]

    /// Reads the original request from an ingress's headers, or says which headers are missing.
    ///
    /// - method: `X-Original-Method` (nginx recipes, ingress-nginx), `X-Forwarded-Method` (Caddy,
    ///   Traefik); for Envoy (`envoyTarget` given) the request's own method.
    /// - path and query: `X-Original-URL` (ingress-nginx: absolute, also the scheme and host),
    ///   `X-Original-URI` (nginx), `X-Forwarded-Uri` (Caddy, Traefik); for Envoy what follows the
    ///   endpoint's path prefix.
    /// - scheme: `X-Forwarded-Proto` (default `https`); host: `X-Forwarded-Host`, else `Host`.
    public static func read(_ fields: Fields, ownMethod: String, envoyTarget: String?) -> Result<ForwardedRequest, ForwardedRequestError> {
        var method = ownMethod
        if envoyTarget == nil {
            // One description only: a client may add a header of another convention, which an
            // ingress passes on; two of them is a question nobody can answer safely.
            switch described(fields, ["x-original-method", "x-forwarded-method"]) {
            case .failure(let error): return .failure(error)
            case .success(let named): method = named.value
            }
        }
        guard !method.isEmpty, method.utf8.count <= 32, method.utf8.allSatisfy(isTokenByte) else {
            return .failure(.malformed("The original method is not an HTTP method."))
        }
        var scheme = (single(fields, "x-forwarded-proto").flatMap { $0.split(separator: ",").first }.map { $0.trimmingSpaces().lowercased() }) ?? "https"
        var host = single(fields, "x-forwarded-host").flatMap { $0.split(separator: ",").first }.map { String($0.trimmingSpaces()) }
            ?? single(fields, "host")
        let target: String
        if let envoyTarget {
            target = envoyTarget.isEmpty ? "/" : envoyTarget
        } else {
            switch described(fields, ["x-original-url", "x-original-uri", "x-forwarded-uri"]) {
            case .failure(let error):
                return .failure(error)
            case .success(let named) where named.name == "x-original-url":
                guard let parsed = absolute(named.value) else { return .failure(.malformed("X-Original-URL is not an absolute http or https URL.")) }
                scheme = parsed.scheme
                host = parsed.host
                target = parsed.target
            case .success(let named):
                target = named.value
            }
        }
        guard target.hasPrefix("/"), target.utf8.count <= 8192, target.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F }) else {
            return .failure(.malformed("The original URI is not a path (it must start with / and hold visible ASCII only)."))
        }
        guard scheme == "https" || scheme == "http" else { return .failure(.malformed("X-Forwarded-Proto is neither https nor http.")) }
        if let named = host, named.isEmpty || !named.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F && $0 != UInt8(ascii: "/") }) {
            return .failure(.malformed("The original host is not a host name."))
        }
        return .success(ForwardedRequest(method: method, target: target, scheme: scheme, host: host))
    }

    /// Headers the relay never lets through because a backend would read them as another
    /// method, another URL or another user (`RelayHeaderPolicy.neverFromClient`), and that an
    /// ingress passes on to the backend unless told not to: a question carrying one is refused,
    /// so no recipe that forgets a line can let one through. (`X-Original-URL`, `X-Forwarded-Host`
    /// and the rest of the forwarding family are the ingresses' own: they are read, not refused.)
    public static let refusedFields: [[UInt8]] = [
        "x-http-method-override", "x-http-method", "x-method-override",
        "x-rewrite-url", "x-original-host", "x-host",
        "x-remote-user", "remote-user", "x-authenticated-user", "x-webauth-user",
        "x-forwarded-user", "x-forwarded-email", "x-forwarded-preferred-username", "x-forwarded-groups",
        "x-forwarded-access-token", "x-auth-request-user", "x-auth-request-email",
        "x-auth-request-preferred-username", "x-auth-request-groups", "x-auth-request-access-token",
    ].map { Array($0.utf8) }

    /// Why a question is not answered whatever it describes, or `nil`: it came through
    /// Gatehouse's public host (an ingress asks on an internal address; a public request that a
    /// trusted proxy relayed to `/forward-auth` is not a question), or it carries one of
    /// `refusedFields` (names compared ignoring case, `_` read as `-`).
    /// - Parameters:
    ///   - authority: the question's own `Host`.
    ///   - publicAuthority: `server.public_base_url`'s host and port (`RelayForwarding.host`).
    ///   - names: the question's header names.
    public static func screen(authority: String?, publicAuthority: String, publicScheme: String,
                              names: some Sequence<String>) -> ForwardedRequestError? {
        if let authority, isSameAuthority(authority, publicAuthority, scheme: publicScheme) {
            return .public
        }
        for name in names where refusedFields.contains(where: { RelayHeaderPolicy.equalsIgnoringASCIICase(name, $0) }) {
            return .smuggled(name)
        }
        return nil
    }

    /// `a` and `b` name the same host and port, the scheme's default port written or not.
    private static func isSameAuthority(_ a: String, _ b: String, scheme: String) -> Bool {
        let port = scheme == "https" ? ":443" : ":80"
        func normal(_ text: String) -> String {
            let lowered = text.lowercased()
            return lowered.hasSuffix(port) ? String(lowered.dropLast(port.count)) : lowered
        }
        return normal(a) == normal(b)
    }

    /// The one field of `names` present, with its one value: missing when none is, ambiguous when
    /// several are, or one is repeated (an ingress sets exactly one, once).
    private static func described(_ fields: Fields, _ names: [String]) -> Result<(name: String, value: String), ForwardedRequestError> {
        let present = names.filter { !fields($0).isEmpty }
        guard let name = present.first else { return .failure(.missing) }
        guard present.count == 1, let value = single(fields, name) else {
            return .failure(.ambiguous(present.count == 1 ? "\(name) is repeated or empty." : "The request names \(present.joined(separator: " and ")): an ingress sets one."))
        }
        return .success((name, value))
    }

    /// The one value of a field; `nil` when absent, empty or repeated (an ingress sets each once).
    private static func single(_ fields: Fields, _ name: String) -> String? {
        let values = fields(name)
        guard values.count == 1 else { return nil }
        let value = values[0].trimmingSpaces()
        return value.isEmpty ? nil : String(value)
    }

    /// `scheme://authority/path?query` → its parts (the target `/` when the URL has no path).
    private static func absolute(_ url: String) -> (scheme: String, host: String, target: String)? {
        let lowered = url.lowercased()
        let scheme: String
        if lowered.hasPrefix("https://") { scheme = "https" } else if lowered.hasPrefix("http://") { scheme = "http" } else { return nil }
        let rest = url.dropFirst(scheme.count + 3)
        let end = rest.firstIndex { $0 == "/" || $0 == "?" || $0 == "#" } ?? rest.endIndex
        let authority = rest[..<end]
        guard !authority.isEmpty, !authority.contains("@") else { return nil }
        var target = String(rest[end...])
        // A fragment never reaches a server: one here is a target the backend would read
        // otherwise than what is judged (`/api/x#/../../admin`).
        guard !target.contains("#") else { return nil }
        if target.isEmpty || target.hasPrefix("?") { target = "/" + target }
        return (scheme, String(authority), target)
    }

    /// RFC 9110 `tchar`.
    private static func isTokenByte(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"): true
        default: "!#$%&'*+-.^_`|~".utf8.contains(byte)
        }
    }
}

/// Why an ingress's question cannot be read.
public enum ForwardedRequestError: Error, Sendable, Equatable {
    /// No header names the original method or URI.
    case missing
    /// Two conventions at once, or one header twice: one of them came from the client.
    case ambiguous(String)
    /// Through Gatehouse's public host: a client's request relayed to the endpoint, not a question.
    case `public`
    /// A header a backend would read as another method, URL or user (`refusedFields`).
    case smuggled(String)
    case malformed(String)

    public var detail: String {
        switch self {
        case .missing:
            "A forward-auth request names the original method and URI: X-Original-Method with X-Original-URI or X-Original-URL "
                + "(nginx, ingress-nginx), or X-Forwarded-Method with X-Forwarded-Uri (Caddy, Traefik)."
        case .ambiguous(let detail): "The original request is described twice. " + detail
        case .public: "Decisions are asked by the ingress on Gatehouse's internal address, never through its public host."
        case .smuggled(let name):
            "The request carries \(name), which the relay never lets through (a backend would read it as another method, URL or user); "
                + "an ingress would pass it on."
        case .malformed(let detail): detail
        }
    }
}

extension StringProtocol {
    fileprivate func trimmingSpaces() -> Substring {
        var text = Substring(self)
        while text.first == " " || text.first == "\t" { text = text.dropFirst() }
        while text.last == " " || text.last == "\t" { text = text.dropLast() }
        return text
    }
}
