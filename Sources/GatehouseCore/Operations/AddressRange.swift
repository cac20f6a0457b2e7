#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// An IP address or a CIDR range (`10.0.0.0/8`, `fd00::/8`, `127.0.0.1`), IPv4 and IPv6 alike:
/// an IPv4 address is compared as its IPv4-mapped IPv6 form, so `::ffff:10.1.2.3` is in `10.0.0.0/8`.
public struct AddressRange: Sendable, Equatable, CustomStringConvertible {
    /// 16 bytes, the range's first address.
    let network: [UInt8]
    /// Leading bits that must match, out of 128.
    let prefixBits: Int
    public let description: String

    public init?(_ text: String) {
        let parts = text.split(separator: "/", maxSplits: 1, omittingEmptySubsequences: false)
        guard let (bytes, isIPv4) = Self.parse(String(parts[0])) else { return nil }
        let width = isIPv4 ? 32 : 128
        var bits = width
        if parts.count == 2 {
            guard let value = Int(parts[1]), (0...width).contains(value), parts[1].allSatisfy(\.isASCII) else { return nil }
            bits = value
        }
        prefixBits = bits + (isIPv4 ? 96 : 0)
        network = Self.masked(bytes, prefixBits: prefixBits)
        description = text
    }

    /// Whether `address` (text, as a peer or a forwarded address is written) is in this range.
    public func contains(_ address: String) -> Bool {
        guard let (bytes, _) = Self.parse(address) else { return false }
        return Self.masked(bytes, prefixBits: prefixBits) == network
    }

    /// The 16-byte form of an IPv4 or IPv6 address (brackets and a zone index are tolerated).
    static func parse(_ text: String) -> ([UInt8], Bool)? {
        var text = Substring(text)
        if text.hasPrefix("["), text.hasSuffix("]") { text = text.dropFirst().dropLast() }
        if let zone = text.firstIndex(of: "%") { text = text[..<zone] }
        guard !text.isEmpty, text.count <= 45 else { return nil }
        var v4 = in_addr()
        if inet_pton(AF_INET, String(text), &v4) == 1 {
            let value = UInt32(bigEndian: v4.s_addr)
            return ([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff,
                     UInt8(value >> 24), UInt8(value >> 16 & 0xff), UInt8(value >> 8 & 0xff), UInt8(value & 0xff)], true)
        }
        var v6 = in6_addr()
        guard inet_pton(AF_INET6, String(text), &v6) == 1 else { return nil }
        let bytes = withUnsafeBytes(of: &v6) { Array($0) }
        return (bytes, false)
    }

    static func masked(_ bytes: [UInt8], prefixBits: Int) -> [UInt8] {
        bytes.enumerated().map { index, byte in
            let kept = min(max(prefixBits - index * 8, 0), 8)
            return kept == 8 ? byte : byte & ~(UInt8(0xff) >> kept)
        }
    }
}

/// The address a request comes from, seen through trusted proxies.
public enum ClientAddress {
    /// The peer itself, unless it is a trusted proxy: then the right-most address of the
    /// forwarding header `header` (`X-Forwarded-For`, or `Forwarded`'s `for=`) that is not itself a
    /// trusted proxy. Only the one header the proxies are known to write is read: most proxies
    /// append to `X-Forwarded-For` and pass a client's own `Forwarded` through untouched, so
    /// reading both would let a client choose its address. A header from an untrusted peer is
    /// ignored (anyone can write one).
    public static func resolve(peer: String?, forwardedFor: String?, forwarded: String?, trusted: [AddressRange],
                               header: RateLimitSettings.ForwardedHeader = .xForwardedFor) -> String? {
        guard let peer, !trusted.isEmpty, trusted.contains(where: { $0.contains(peer) }) else { return peer }
        let chain: [String]
        switch header {
        case .xForwardedFor:
            guard let forwardedFor, !forwardedFor.isEmpty else { return peer }
            chain = forwardedFor.split(separator: ",").map { withoutPort($0.trimmingSpaces()) }
        case .forwarded:
            guard let forwarded, !forwarded.isEmpty else { return peer }
            chain = forwardedForValues(forwarded)
        }
        for hop in chain.reversed() {
            guard AddressRange.parse(hop) != nil else { return peer }  // junk in the chain: stop trusting it
            if !trusted.contains(where: { $0.contains(hop) }) { return hop }
        }
        return chain.first ?? peer
    }

    /// The key an address is counted under: an IPv6 address by its /64 (one subscriber holds a
    /// whole /64 and could otherwise take a new bucket per request), any other as it is.
    public static func bucketKey(_ address: String) -> String {
        guard let (bytes, isIPv4) = AddressRange.parse(address), !isIPv4 else { return address }
        if bytes[0..<10].allSatisfy({ $0 == 0 }), bytes[10] == 0xff, bytes[11] == 0xff {
            return bytes[12...].map { String($0) }.joined(separator: ".")  // IPv4-mapped: the IPv4 address
        }
        let words = stride(from: 0, to: 8, by: 2).map { String(UInt16(bytes[$0]) << 8 | UInt16(bytes[$0 + 1]), radix: 16) }
        return words.joined(separator: ":") + "::/64"
    }

    /// `192.0.2.1:4711` → `192.0.2.1`, `[2001:db8::1]:4711` → `2001:db8::1` (some proxies write ports).
    static func withoutPort(_ hop: String) -> String {
        if hop.hasPrefix("["), let close = hop.firstIndex(of: "]") { return String(hop[hop.index(after: hop.startIndex)..<close]) }
        if hop.filter({ $0 == ":" }).count == 1, let colon = hop.firstIndex(of: ":") { return String(hop[..<colon]) }
        return hop
    }

    /// The `for=` values of RFC 7239 `Forwarded`, in order (quoted IPv6 and ports unwrapped).
    static func forwardedForValues(_ header: String) -> [String] {
        header.split(separator: ",").compactMap { element in
            element.split(separator: ";").lazy.map { $0.trimmingSpaces() }.first { $0.lowercased().hasPrefix("for=") }
                .map { value in
                    var node = Substring(value.dropFirst(4))
                    if node.hasPrefix("\""), node.hasSuffix("\""), node.count >= 2 { node = node.dropFirst().dropLast() }
                    return withoutPort(String(node))
                }
        }
    }
}

extension Substring {
    fileprivate func trimmingSpaces() -> String {
        String(drop { $0 == " " || $0 == "\t" }.reversed().drop { $0 == " " || $0 == "\t" }.reversed())
    }
}
