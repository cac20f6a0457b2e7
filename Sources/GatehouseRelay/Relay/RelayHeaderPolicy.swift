import Foundation
public import GatehouseCore
public import NIOHTTP1

/// Which headers cross Gatehouse, in each direction (RFC 9110 §7.6.1 and the route's rules).
public struct RelayHeaderPolicy: Sendable {
    /// Hop-by-hop headers: they describe one connection and never cross a proxy.
    public static let hopByHop: Set<String> = [
        "connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade",
        "proxy-authenticate", "proxy-authorization",
    ]
    /// Headers a client may never send a backend: the ones Gatehouse sets itself (`Host`,
    /// `Content-Length`, `Via`, `X-Request-Id`, `X-Client-Request-Id`, the `Forwarded` family),
    /// and every header that common frameworks and proxies read as the client's address, the
    /// signed-in user, the original URL or the method (`X-Original-URL`, `True-Client-IP`,
    /// `X-HTTP-Method-Override`…). Every `X-Forwarded-*` name is dropped too, whatever its suffix.
    public static let neverFromClient: Set<String> = [
        "host", "content-length", "expect", "via", "x-request-id", "x-client-request-id",
        "forwarded", "x-forwarded", "x-real-ip", "x-original-url", "x-original-uri", "x-rewrite-url",
        "true-client-ip", "x-client-ip", "client-ip", "cf-connecting-ip", "x-cluster-client-ip", "fastly-client-ip",
        "x-originating-ip", "x-remote-ip", "x-remote-addr", "x-host", "x-original-host",
        "x-http-method-override", "x-http-method", "x-method-override", "x-original-forwarded-for",
        "x-remote-user", "remote-user", "x-authenticated-user", "x-webauth-user",
        // A DPoP proof is Gatehouse's to check and spend (RFC 9449): it never goes further.
        "dpop",
    ]
    /// Any header whose name starts with one of these (`_` read as `-`) is dropped: the forwarding
    /// family, oauth2-proxy's identity headers, Envoy's internal ones.
    public static let neverFromClientPrefixes = ["x-forwarded-", "x-auth-request-", "x-envoy-"].map { Array($0.utf8) }

    /// Lower-cased identity header names of the route: a client can never send its own.
    public let identityHeaders: Set<String>
    public let authorization: BackendAuthorization
    private let identityHeaderBytes: [[UInt8]]
    /// The route's own identity headers: name and source.
    private let routeIdentityHeaders: [(name: String, source: String)]

    public init(route: RouteSettings, allIdentityHeaders: Set<String>) {
        self.identityHeaders = allIdentityHeaders.union(route.identityHeaders.map { $0.name.lowercased() })
        self.authorization = route.authorization
        self.identityHeaderBytes = identityHeaders.map { Array($0.utf8) }
        self.routeIdentityHeaders = route.identityHeaders
    }

    /// The head toward the backend, as both relay paths send it: the app's end-to-end headers
    /// this policy lets through, the caller's identity headers, `authorization` (when set, in
    /// place of the app's), then Gatehouse's forwarding headers. `host` leads when given.
    /// - Parameter clientRequestID: the app's own plain `X-Request-Id`, read once by the caller
    ///   (it logs it too), sent as `X-Client-Request-Id`.
    public func outboundHeaders(from head: some RelayRequestHead, connectionTokens: Set<String>, identity: CallerIdentity,
                                authorization: String?, host: String?, forwarding: RelayForwarding,
                                peer: RelayForwarding.Peer, requestID: String, clientRequestID: String?) -> HTTPHeaders {
        var headers = HTTPHeaders()
        headers.reserveCapacity(16)
        if let host { headers.add(name: "Host", value: host) }
        head.forEachField { name, value in
            guard forwardsRequestHeader(name, connectionTokens: connectionTokens) else { return }
            if authorization != nil, Self.equalsIgnoringASCIICase(name, Self.authorizationBytes) { return }
            if Self.equalsIgnoringASCIICase(name, Self.cookieBytes), value.contains(Self.sessionCookieName) {
                // Gatehouse's web-session cookie authenticates the caller to Gatehouse only.
                if let kept = Self.withoutSessionCookie(value) { headers.add(name: name, value: kept) }
                return
            }
            headers.add(name: name, value: value)
        }
        if let authorization { headers.add(name: "Authorization", value: "Bearer " + authorization) }
        for header in routeIdentityHeaders {
            if let value = identity.value(of: header.source) { headers.add(name: header.name, value: Self.headerSafe(value)) }
        }
        forwarding.add(to: &headers, peer: peer, requestID: requestID, clientRequestID: clientRequestID)
        return headers
    }

    /// Identity values come from another service: no control character may reach a header
    /// (a CR or LF would split it), and no value is longer than 1 KiB.
    public static func headerSafe(_ value: String) -> String {
        if value.utf8.count <= 1024, value.utf8.allSatisfy({ $0 >= 0x20 && $0 != 0x7F }) { return value }
        return String(String.UnicodeScalarView(value.unicodeScalars.filter { $0.value >= 0x20 && $0.value != 0x7F }.prefix(1024)))
    }

    /// Whether a request header from the app goes on to the backend. `name` may be in any case
    /// and `_` counts as `-`; the common case allocates nothing (both relay paths call this).
    /// - Parameter connectionTokens: the lower-cased names listed in the request's `Connection` header.
    public func forwardsRequestHeader(_ name: String, connectionTokens: Set<String>) -> Bool {
        if Self.isHopByHop(name) || Self.isNeverFromClient(name) { return false }
        if identityHeaderBytes.contains(where: { Self.equalsIgnoringASCIICase(name, $0) }) { return false }
        if Self.equalsIgnoringASCIICase(name, Self.authorizationBytes) { return authorization == .passthrough }
        if !connectionTokens.isEmpty, connectionTokens.contains(name.lowercased().replacingOccurrences(of: "_", with: "-")) {
            return false
        }
        return true
    }

    private static let authorizationBytes = Array("authorization".utf8)
    private static let cookieBytes = Array("cookie".utf8)
    /// The web-session cookie of `/session` (`accept_session_cookie` routes).
    public static let sessionCookieName = "__Host-gatehouse-session"

    /// A `Cookie` header value without Gatehouse's web-session cookie; `nil` when nothing remains.
    public static func withoutSessionCookie(_ value: String) -> String? {
        let kept = value.split(separator: ";").map { $0.trimmingCharacters(in: .whitespaces) }
            .filter { !$0.isEmpty && !$0.hasPrefix(sessionCookieName + "=") }
        return kept.isEmpty ? nil : kept.joined(separator: "; ")
    }

    /// The value of Gatehouse's web-session cookie in `Cookie` header values; `nil` when absent or repeated.
    public static func sessionCookie(in values: [String]) -> String? {
        var found: String?
        for value in values {
            for pair in value.split(separator: ";") {
                let trimmed = pair.trimmingCharacters(in: .whitespaces)
                guard trimmed.hasPrefix(sessionCookieName + "=") else { continue }
                guard found == nil else { return nil }
                found = String(trimmed.dropFirst(sessionCookieName.count + 1))
            }
        }
        return found.flatMap { $0.isEmpty ? nil : $0 }
    }

    /// The fast path's answer head toward the app: the backend's headers without the hop-by-hop
    /// ones, those its `Connection` lists and its own `X-Request-Id`, then Gatehouse's request id.
    /// One pass, and the names `Connection` lists are worked out only when it lists more than
    /// `keep-alive` or `close` (what nearly every backend sends).
    public static func relayedResponseHeaders(_ headers: HTTPHeaders, requestID: String) -> HTTPHeaders {
        var listed: Set<String> = []
        for (name, value) in headers where isNamed(name, "connection") && !isPlainConnectionValue(value) {
            listed.formUnion(connectionTokens([value]))
        }
        var relayed = HTTPHeaders()
        relayed.reserveCapacity(headers.count + 1)
        for (name, value) in headers {
            if isHopByHop(name) || isNamed(name, "x-request-id") { continue }
            if !listed.isEmpty, listed.contains(name.lowercased()) { continue }
            relayed.add(name: name, value: value)
        }
        relayed.add(name: "X-Request-Id", value: requestID)
        return relayed
    }

    /// `keep-alive` or `close` alone, in any case, with optional whitespace around.
    private static func isPlainConnectionValue(_ value: String) -> Bool {
        var bytes = value.utf8[...]
        while bytes.first == UInt8(ascii: " ") || bytes.first == UInt8(ascii: "\t") { bytes = bytes.dropFirst() }
        while bytes.last == UInt8(ascii: " ") || bytes.last == UInt8(ascii: "\t") { bytes = bytes.dropLast() }
        let folded = bytes.lazy.map { $0 >= 65 && $0 <= 90 ? $0 | 0x20 : $0 }
        return folded.elementsEqual("keep-alive".utf8) || folded.elementsEqual("close".utf8)
    }

    /// Whether a response header from the backend goes back to the app.
    public static func forwardsResponseHeader(_ lowercasedName: String, connectionTokens: Set<String>) -> Bool {
        !hopByHop.contains(lowercasedName) && !connectionTokens.contains(lowercasedName) && lowercasedName != "content-length"
    }

    /// The names listed in a `Connection` header value, lower-cased.
    public static func connectionTokens(_ values: [String]) -> Set<String> {
        var tokens: Set<String> = []
        for value in values {
            for token in value.utf8.split(separator: UInt8(ascii: ",")) {
                var token = token[...]
                while token.first == UInt8(ascii: " ") || token.first == UInt8(ascii: "\t") { token = token.dropFirst() }
                while token.last == UInt8(ascii: " ") || token.last == UInt8(ascii: "\t") { token = token.dropLast() }
                if !token.isEmpty { tokens.insert(String(decoding: token.map { $0 | (($0 >= 65 && $0 <= 90) ? 0x20 : 0) }, as: UTF8.self)) }
                // `Connection: X_Private` names `X-Private` too, as header names are compared.
                if token.contains(UInt8(ascii: "_")) {
                    tokens.insert(String(decoding: token.map { $0 == UInt8(ascii: "_") ? UInt8(ascii: "-") : ($0 | (($0 >= 65 && $0 <= 90) ? 0x20 : 0)) },
                                         as: UTF8.self))
                }
            }
        }
        return tokens
    }

    /// Whether `name` (any case) is a hop-by-hop header, without allocating.
    public static func isHopByHop(_ name: String) -> Bool {
        hopByHopBytes.contains { equalsIgnoringASCIICase(name, $0) }
    }

    /// Whether `name` (any case, `_` read as `-`) is one a client may never send a backend.
    public static func isNeverFromClient(_ name: String) -> Bool {
        if hasForwardedPrefix(name) { return true }
        return neverFromClientBytes.contains { equalsIgnoringASCIICase(name, $0) }
    }

    private static func hasForwardedPrefix(_ name: String) -> Bool {
        let utf8 = name.utf8
        return neverFromClientPrefixes.contains { prefix in
            utf8.count >= prefix.count && zip(utf8, prefix).allSatisfy { folded($0) == $1 }
        }
    }

    /// Compares a header name to a lower-case ASCII name, ignoring the case of the first and
    /// reading `_` as `-`: backends behind CGI-style gateways fold `X_BPId` into `X-BPId`, so
    /// an underscore variant must never slip past a check on the dashed name.
    public static func equalsIgnoringASCIICase(_ name: String, _ lowercase: [UInt8]) -> Bool {
        let utf8 = name.utf8
        guard utf8.count == lowercase.count else { return false }
        return zip(utf8, lowercase).allSatisfy { folded($0) == $1 }
    }

    /// A header-name byte as the comparisons above read it: lower case, `_` as `-`.
    private static func folded(_ byte: UInt8) -> UInt8 {
        byte >= 65 && byte <= 90 ? byte | 0x20 : (byte == UInt8(ascii: "_") ? UInt8(ascii: "-") : byte)
    }

    /// Whether header `name` is `lowercase`, ASCII case ignored and nothing else (`_` is not
    /// `-` here): how NIO's parser reads framing fields, so how Gatehouse reads them too.
    public static func isNamed(_ name: String, _ lowercase: StaticString) -> Bool {
        let utf8 = name.utf8
        guard utf8.count == lowercase.utf8CodeUnitCount else { return false }
        return lowercase.withUTF8Buffer { expected in
            zip(utf8, expected).allSatisfy { ($0 >= 65 && $0 <= 90 ? $0 | 0x20 : $0) == $1 }
        }
    }

    private static let hopByHopBytes = hopByHop.map { Array($0.utf8) }
    private static let neverFromClientBytes = neverFromClient.map { Array($0.utf8) }
}
