import Foundation
public import GatehouseCore

/// Which headers cross Gatehouse, in each direction (RFC 9110 §7.6.1 and the route's rules).
public struct RelayHeaderPolicy: Sendable {
    /// Hop-by-hop headers: they describe one connection and never cross a proxy.
    public static let hopByHop: Set<String> = [
        "connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade",
        "proxy-authenticate", "proxy-authorization",
    ]
    /// Headers Gatehouse sets itself toward the backend; a client's copies are dropped, never merged.
    public static let setByGatehouse: Set<String> = [
        "host", "content-length", "forwarded", "x-forwarded-for", "x-forwarded-proto", "x-forwarded-host",
        "x-forwarded-port", "x-real-ip", "x-request-id", "via", "expect",
    ]

    /// Lower-cased identity header names of the route: a client can never send its own.
    public let identityHeaders: Set<String>
    public let authorization: BackendAuthorization
    private let identityHeaderBytes: [[UInt8]]

    public init(route: RouteSettings, allIdentityHeaders: Set<String>) {
        self.identityHeaders = allIdentityHeaders.union(route.identityHeaders.map { $0.name.lowercased() })
        self.authorization = route.authorization
        self.identityHeaderBytes = identityHeaders.map { Array($0.utf8) }
    }

    /// Whether a request header from the app goes on to the backend. `name` may be in any case
    /// and `_` counts as `-`; the common case allocates nothing (both relay paths call this).
    /// - Parameter connectionTokens: the lower-cased names listed in the request's `Connection` header.
    public func forwardsRequestHeader(_ name: String, connectionTokens: Set<String>) -> Bool {
        if Self.isHopByHop(name) || Self.isSetByGatehouse(name) { return false }
        if identityHeaderBytes.contains(where: { Self.equalsIgnoringASCIICase(name, $0) }) { return false }
        if Self.equalsIgnoringASCIICase(name, Self.authorizationBytes) { return authorization == .passthrough }
        if !connectionTokens.isEmpty, connectionTokens.contains(name.lowercased().replacingOccurrences(of: "_", with: "-")) {
            return false
        }
        return true
    }

    private static let authorizationBytes = Array("authorization".utf8)

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
            }
        }
        return tokens
    }

    /// Whether `name` (any case) is a hop-by-hop header, without allocating.
    public static func isHopByHop(_ name: String) -> Bool {
        hopByHopBytes.contains { equalsIgnoringASCIICase(name, $0) }
    }

    /// Whether `name` (any case) is set by Gatehouse itself toward backends, without allocating.
    public static func isSetByGatehouse(_ name: String) -> Bool {
        setByGatehouseBytes.contains { equalsIgnoringASCIICase(name, $0) }
    }

    /// Compares a header name to a lower-case ASCII name, ignoring the case of the first and
    /// reading `_` as `-`: backends behind CGI-style gateways fold `X_BPId` into `X-BPId`, so
    /// an underscore variant must never slip past a check on the dashed name.
    public static func equalsIgnoringASCIICase(_ name: String, _ lowercase: [UInt8]) -> Bool {
        let utf8 = name.utf8
        guard utf8.count == lowercase.count else { return false }
        return zip(utf8, lowercase).allSatisfy { byte, expected in
            let folded = byte >= 65 && byte <= 90 ? byte | 0x20 : (byte == UInt8(ascii: "_") ? UInt8(ascii: "-") : byte)
            return folded == expected
        }
    }

    private static let hopByHopBytes = hopByHop.map { Array($0.utf8) }
    private static let setByGatehouseBytes = setByGatehouse.map { Array($0.utf8) }

    /// A relayed path must not climb out of its prefix: no `.`/`..` segments, raw or percent-encoded,
    /// no empty segments, no backslashes, no encoded slashes. One pass over the bytes.
    public static func isSafe(path: String) -> Bool {
        var segmentDots = 0       // dots (raw or %2e) in the current segment so far
        var segmentOther = false  // anything else in the current segment
        var previousSlash = false
        let bytes = Array(path.utf8)
        var index = 0
        func segmentIsDots() -> Bool { !segmentOther && (segmentDots == 1 || segmentDots == 2) }
        while index < bytes.count {
            let byte = bytes[index]
            switch byte {
            case UInt8(ascii: "/"):
                if previousSlash || segmentIsDots() { return false }
                previousSlash = true
                segmentDots = 0
                segmentOther = false
            case UInt8(ascii: "\\"):
                return false
            case UInt8(ascii: "%") where index + 2 < bytes.count:
                let high = bytes[index + 1], low = bytes[index + 2] | 0x20
                if high == UInt8(ascii: "2") && low == UInt8(ascii: "e") {
                    segmentDots += 1
                } else if (high == UInt8(ascii: "2") && low == UInt8(ascii: "f")) || (high == UInt8(ascii: "5") && low == UInt8(ascii: "c")) {
                    return false
                } else {
                    segmentOther = true
                }
                previousSlash = false
                index += 2
            case UInt8(ascii: "."):
                segmentDots += 1
                previousSlash = false
            default:
                segmentOther = true
                previousSlash = false
            }
            index += 1
        }
        return !segmentIsDots()
    }

}
