public import NIOHTTP1

/// The headers Gatehouse itself tells a backend about the request: `Forwarded` (RFC 7239),
/// `X-Forwarded-For`/`-Proto`/`-Host`, `Via`, its own `X-Request-Id` and, when the app sent a
/// plain one, the app's id as `X-Client-Request-Id`. Both relay paths add exactly these.
public struct RelayForwarding: Sendable {
    /// `https` or `http`, from the public base URL.
    public let proto: String
    /// The public host (and port), from the public base URL.
    public let host: String

    public init(publicBaseURL: String) {
        self.proto = publicBaseURL.hasPrefix("https://") ? "https" : "http"
        self.host = publicBaseURL.split(separator: "/", omittingEmptySubsequences: true).dropFirst().first.map(String.init) ?? ""
    }

    /// What the forwarding headers say about one peer: worked out once per connection by the
    /// fast path (a connection has one peer), per request by the general path.
    public struct Peer: Sendable {
        /// Also `X-Forwarded-For`'s value; `nil` when unknown (no `X-Forwarded-For`).
        public let remoteAddress: String?
        /// `Forwarded`'s value.
        let forwarded: String
    }

    public func peer(_ remoteAddress: String?) -> Peer {
        guard let remoteAddress else { return Peer(remoteAddress: nil, forwarded: "proto=\(proto);host=\"\(host)\"") }
        let node = remoteAddress.contains(":") ? "\"[\(remoteAddress)]\"" : remoteAddress
        return Peer(remoteAddress: remoteAddress, forwarded: "for=\(node);proto=\(proto);host=\"\(host)\"")
    }

    public func add(to headers: inout HTTPHeaders, peer: Peer, requestID: String, clientRequestID: String?) {
        if let remoteAddress = peer.remoteAddress { headers.add(name: "X-Forwarded-For", value: remoteAddress) }
        headers.add(name: "Forwarded", value: peer.forwarded)
        headers.add(name: "X-Forwarded-Proto", value: proto)
        headers.add(name: "X-Forwarded-Host", value: host)
        headers.add(name: "X-Request-Id", value: requestID)
        if let clientRequestID { headers.add(name: "X-Client-Request-Id", value: clientRequestID) }
        headers.add(name: "Via", value: "1.1 gatehouse")
    }

    /// A client's `X-Request-Id`, kept for correlation only when short and plain
    /// (1–64 of `A–Z a–z 0–9 - _ .`); it never becomes Gatehouse's own id.
    public static func acceptableClientRequestID(_ value: String) -> String? {
        guard (1...64).contains(value.utf8.count),
              value.utf8.allSatisfy({ $0 == UInt8(ascii: "-") || $0 == UInt8(ascii: "_") || $0 == UInt8(ascii: ".")
                  || (48...57).contains($0) || (65...90).contains($0) || (97...122).contains($0) })
        else { return nil }
        return value
    }
}
