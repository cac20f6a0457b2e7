/// A redirect URI registered for an app client, and the RFC 8252 rules for matching it.
///
/// - Private-use schemes must be reverse domain names (`com.example.app:/callback`, §7.1).
/// - Claimed `https` URIs match exactly (§7.2).
/// - Loopback `http://127.0.0.1` and `http://[::1]` URIs match on any port (§7.3);
///   `localhost` is refused at registration (§8.3).
/// Every other comparison is an exact, case-sensitive string match (RFC 6749 §3.1.2.3, RFC 9700 §4.1.3):
/// no trailing-slash, case, query or fragment leniency.
public struct RedirectURI: Sendable, Hashable, CustomStringConvertible {
    /// The registered text.
    public let registered: String
    private let loopback: (prefix: String, rest: String)?

    public var description: String { registered }

    /// Validates a URI for registration; throws a message fit for a configuration error.
    public init(registering text: String) throws(RedirectURIError) {
        guard !text.isEmpty, text.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F }) else {
            throw .init("must be a non-empty URI without spaces or non-ASCII characters")
        }
        guard !text.contains("#") else { throw .init("must not contain a fragment (RFC 6749 §3.1.2)") }
        guard let colon = text.firstIndex(of: ":") else { throw .init("must be an absolute URI with a scheme") }
        let scheme = String(text[..<colon])
        let rest = String(text[text.index(after: colon)...])
        guard Self.isValidScheme(scheme) else {
            throw .init("has an invalid scheme '\(scheme)' (lower case letters, digits, '+', '-', '.')")
        }
        switch scheme {
        case "https":
            guard rest.hasPrefix("//"), rest.count > 2 else { throw .init("must be https://host/…") }
            self.loopback = nil
        case "http":
            let hosts = ["//127.0.0.1", "//[::1]"]
            guard let host = hosts.first(where: { rest.hasPrefix($0) }) else {
                if rest.hasPrefix("//localhost") {
                    throw .init("uses 'localhost'; register http://127.0.0.1 or http://[::1] instead (RFC 8252 §8.3)")
                }
                throw .init("uses plain http on a host other than a loopback IP literal (RFC 8252 §7.3, §8.3)")
            }
            var afterHost = rest.dropFirst(host.count)
            if afterHost.first == ":" {
                let port = afterHost.dropFirst().prefix { $0.isNumber }
                guard !port.isEmpty else { throw .init("has an empty port") }
                afterHost = afterHost.dropFirst(1 + port.count)
            }
            guard afterHost.isEmpty || afterHost.first == "/" || afterHost.first == "?" else {
                throw .init("has an invalid loopback authority")
            }
            self.loopback = (prefix: "http:" + host, rest: String(afterHost))
        default:
            guard scheme.split(separator: ".").count >= 2, !scheme.hasPrefix("."), !scheme.hasSuffix(".") else {
                throw .init("uses the private-use scheme '\(scheme)', which must be a reverse domain name such as com.example.app (RFC 8252 §7.1)")
            }
            guard !rest.isEmpty else { throw .init("has nothing after the scheme") }
            self.loopback = nil
        }
        self.registered = text
    }

    /// Whether a redirect URI sent by the app matches this registration.
    public func matches(_ presented: String) -> Bool {
        guard let loopback else { return presented == registered }
        guard presented.hasPrefix(loopback.prefix) else { return false }
        var rest = presented.dropFirst(loopback.prefix.count)
        if rest.first == ":" {
            let port = rest.dropFirst().prefix { $0.isASCII && $0.isNumber }
            guard let number = Int(port), (1...65535).contains(number), port.first != "0" else { return false }
            rest = rest.dropFirst(1 + port.count)
        }
        return rest == loopback.rest
    }

    /// Adds parameters to a redirect URI, after any query it already has.
    public static func appending(_ parameters: [(String, String)], to uri: String) -> String {
        guard !parameters.isEmpty else { return uri }
        let query = FormParameters.encode(pairs: parameters)
        return uri + (uri.contains("?") ? "&" : "?") + query
    }

    private static func isValidScheme(_ scheme: String) -> Bool {
        guard let first = scheme.unicodeScalars.first, ("a"..."z").contains(first) else { return false }
        return scheme.unicodeScalars.allSatisfy {
            ("a"..."z").contains($0) || ("0"..."9").contains($0) || $0 == "+" || $0 == "-" || $0 == "."
        }
    }

    public static func == (lhs: Self, rhs: Self) -> Bool { lhs.registered == rhs.registered }
    public func hash(into hasher: inout Hasher) { hasher.combine(registered) }
}

/// Why a redirect URI cannot be registered.
public struct RedirectURIError: Error, Sendable, CustomStringConvertible {
    public let description: String
    init(_ description: String) { self.description = description }
}
