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

    public init(route: RouteSettings, allIdentityHeaders: Set<String>) {
        self.identityHeaders = allIdentityHeaders.union(route.identityHeaders.map { $0.name.lowercased() })
        self.authorization = route.authorization
    }

    /// Whether a request header from the app goes on to the backend.
    /// - Parameter connectionTokens: the lower-cased names listed in the request's `Connection` header.
    public func forwardsRequestHeader(_ lowercasedName: String, connectionTokens: Set<String>) -> Bool {
        if Self.hopByHop.contains(lowercasedName) || Self.setByGatehouse.contains(lowercasedName) { return false }
        if connectionTokens.contains(lowercasedName) || identityHeaders.contains(lowercasedName) { return false }
        if lowercasedName == "authorization" { return authorization == .passthrough }
        return true
    }

    /// Whether a response header from the backend goes back to the app.
    public static func forwardsResponseHeader(_ lowercasedName: String, connectionTokens: Set<String>) -> Bool {
        !hopByHop.contains(lowercasedName) && !connectionTokens.contains(lowercasedName) && lowercasedName != "content-length"
    }

    /// The names listed in a `Connection` header value, lower-cased.
    public static func connectionTokens(_ values: [String]) -> Set<String> {
        Set(values.flatMap { $0.split(separator: ",") }.map { $0.trimmingCharacters(in: .whitespaces).lowercased() })
    }

    /// A relayed path must not climb out of its prefix: no `.`/`..` segments, raw or percent-encoded,
    /// no empty segments, no backslashes.
    public static func isSafe(path: String) -> Bool {
        let lowered = path.lowercased()
        if lowered.contains("//") || lowered.contains("\\") || lowered.contains("%2f") || lowered.contains("%5c") { return false }
        let decoded = lowered.replacingOccurrences(of: "%2e", with: ".")
        return !decoded.split(separator: "/", omittingEmptySubsequences: false).contains { $0 == "." || $0 == ".." }
    }
}
