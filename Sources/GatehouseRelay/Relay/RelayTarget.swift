import GatehouseCore

/// The request target a relayed request is sent with: the route's backend path followed by
/// the app's own bytes after the route prefix, query included, byte for byte.
///
/// Nothing is decoded and encoded again on the way (RFC 3986 §2.4: decoding and re-encoding
/// can change what a path means). What Gatehouse cannot carry faithfully, or what a backend
/// could read as a different path than Gatehouse checked, is refused instead:
///
/// - any byte outside RFC 3986 `pchar` and `/` in the path, or outside `pchar`, `/` and `?`
///   in the query (raw spaces, backslashes, `#`, `"`, `<`, `>`, `{`, `}`, `|`, `^`, `` ` ``,
///   `[`, `]`, non-ASCII and control bytes);
/// - a `%` not followed by two hex digits;
/// - a path whose percent-decoded bytes are not valid UTF-8 (overlong forms such as `%c0%ae`,
///   surrogates, lone continuation bytes), or decode to a control character (`%00`–`%1f`, `%7f`);
/// - an encoded `/` or `\` (`%2f`, `%5c`), which servers disagree about;
/// - an encoded unreserved character (`%41`, `%2e`): RFC 3986 §6.2.2.2 lets a backend decode
///   it, and a path that changes when normalised could have matched another route;
/// - an empty segment, or a segment whose part before its first `;` decodes to nothing, `.`
///   or `..` (servlet containers read `..;x` as `..`).
public struct RelayTarget: Sendable, Equatable {
    /// The request target to send: backend path, the rest of the app's path, `?` and query.
    public let target: String

    /// Why a target is refused, in words fit for a 400.
    public struct Refusal: Error, Sendable, Equatable, CustomStringConvertible {
        public let description: String
    }

    /// Builds the target for the app's raw request target `rawTarget` on a route with
    /// prefix `prefix` whose backend path is `backendPath` (no trailing slash; may be empty).
    public static func make(rawTarget: String, prefix: String, backendPath: String) -> Result<RelayTarget, Refusal> {
        var utf8 = rawTarget.utf8[...]
        let queryStart = utf8.firstIndex(of: UInt8(ascii: "?"))
        let path = queryStart.map { utf8[..<$0] } ?? utf8
        let skip = prefix.utf8.last == UInt8(ascii: "/") ? prefix.utf8.count - 1 : prefix.utf8.count
        guard path.count >= skip, path.starts(with: prefix.utf8.prefix(skip)) else {
            return .failure(Refusal(description: "The path is not under the route's prefix"))
        }
        let rest = path.dropFirst(skip)
        if let problem = checkPath(rest) { return .failure(problem) }
        var target = backendPath
        if let queryStart {
            utf8 = utf8[utf8.index(after: queryStart)...]
            if let problem = checkQuery(utf8) { return .failure(problem) }
        }
        target += String(decoding: rest, as: UTF8.self)
        if target.isEmpty { target = "/" }
        if let queryStart {
            target += String(decoding: rawTarget.utf8[queryStart...], as: UTF8.self)
        }
        return .success(RelayTarget(target: target))
    }

    // MARK: The rules

    /// RFC 3986 `unreserved`: `A–Z a–z 0–9 - . _ ~`.
    private static let unreserved = byteTable(letting: "-._~")
    /// RFC 3986 `pchar` without `%`: `unreserved / sub-delims / ":" / "@"`.
    private static let pchar = byteTable(letting: "-._~!$&'()*+,;=:@")

    /// A byte lookup table letting ASCII letters, digits and `others` through.
    private static func byteTable(letting others: String) -> [Bool] {
        var table = [Bool](repeating: false, count: 256)
        for byte in UInt8(ascii: "a")...UInt8(ascii: "z") { table[Int(byte)] = true }
        for byte in UInt8(ascii: "A")...UInt8(ascii: "Z") { table[Int(byte)] = true }
        for byte in UInt8(ascii: "0")...UInt8(ascii: "9") { table[Int(byte)] = true }
        for byte in others.utf8 { table[Int(byte)] = true }
        return table
    }

    /// Checks the rest of the path (it starts with `/` or is empty). One pass, no allocation
    /// unless a percent-encoded non-ASCII byte needs UTF-8 validation.
    static func checkPath(_ rest: Substring.UTF8View) -> Refusal? {
        if rest.isEmpty { return nil }
        guard rest.first == UInt8(ascii: "/") else { return Refusal(description: "The path is not under the route's prefix") }
        var index = rest.startIndex
        var nonASCII = false
        // The current segment, up to its first ';': how many bytes, and whether all are dots.
        var segmentLength = 0
        var segmentDots = 0
        var inParameters = false
        var atSegmentStart = true
        func segmentEnds() -> Refusal? {
            if segmentLength == 0 { return Refusal(description: "The path has an empty segment") }
            if segmentDots == segmentLength && segmentLength <= 2 { return Refusal(description: "The path has a '.' or '..' segment") }
            return nil
        }
        while index < rest.endIndex {
            let byte = rest[index]
            if byte == UInt8(ascii: "/") {
                if !atSegmentStart, let refusal = segmentEnds() { return refusal }
                if atSegmentStart && index != rest.startIndex { return Refusal(description: "The path has an empty segment") }
                atSegmentStart = true
                segmentLength = 0
                segmentDots = 0
                inParameters = false
                index = rest.index(after: index)
                continue
            }
            if atSegmentStart { atSegmentStart = false }
            var decoded = byte
            if byte == UInt8(ascii: "%") {
                let high = rest.index(after: index)
                guard high < rest.endIndex, rest.index(after: high) < rest.endIndex,
                      let h = PercentEncoding.hexValue(rest[high]), let l = PercentEncoding.hexValue(rest[rest.index(after: high)]) else {
                    return Refusal(description: "The path has a malformed percent-encoding")
                }
                decoded = h << 4 | l
                if decoded < 0x20 || decoded == 0x7F { return Refusal(description: "The path encodes a control character") }
                if decoded == UInt8(ascii: "/") || decoded == UInt8(ascii: "\\") {
                    return Refusal(description: "The path has an encoded '/' or '\\'")
                }
                if unreserved[Int(decoded)] {
                    // RFC 3986 §6.2.2.2: a backend may decode it, and then read another path
                    // (`%61dmin` is `admin`) than the one routes were matched on.
                    return Refusal(description: "The path percent-encodes a character that needs no encoding")
                }
                if decoded >= 0x80 { nonASCII = true }
                index = rest.index(index, offsetBy: 3)
            } else {
                guard pchar[Int(byte)] else { return Refusal(description: "The path has a character that must be percent-encoded") }
                index = rest.index(after: index)
            }
            if inParameters { continue }
            if byte == UInt8(ascii: ";") {
                // `..;x` is `..` to a servlet container, `;x` an empty segment.
                inParameters = true
                if let refusal = segmentEnds() { return refusal }
                continue
            }
            segmentLength += 1
            if decoded == UInt8(ascii: ".") { segmentDots += 1 }
        }
        if !atSegmentStart, !inParameters, let refusal = segmentEnds() { return refusal }
        if nonASCII, !decodesToValidUTF8(rest) { return Refusal(description: "The path does not decode to valid UTF-8") }
        return nil
    }

    /// Checks the query: RFC 3986 `query` characters, well-formed percent-encodings.
    static func checkQuery(_ query: Substring.UTF8View) -> Refusal? {
        var index = query.startIndex
        while index < query.endIndex {
            let byte = query[index]
            if byte == UInt8(ascii: "%") {
                let high = query.index(after: index)
                guard high < query.endIndex, query.index(after: high) < query.endIndex,
                      PercentEncoding.hexValue(query[high]) != nil, PercentEncoding.hexValue(query[query.index(after: high)]) != nil else {
                    return Refusal(description: "The query has a malformed percent-encoding")
                }
                index = query.index(index, offsetBy: 3)
                continue
            }
            guard pchar[Int(byte)] || byte == UInt8(ascii: "/") || byte == UInt8(ascii: "?") else {
                return Refusal(description: "The query has a character that must be percent-encoded")
            }
            index = query.index(after: index)
        }
        return nil
    }

    /// Whether the percent-decoded bytes are valid UTF-8 (Swift's validation refuses overlong
    /// forms, surrogates and code points past U+10FFFF). Called only when one is non-ASCII.
    private static func decodesToValidUTF8(_ rest: Substring.UTF8View) -> Bool {
        var decoded: [UInt8] = []
        decoded.reserveCapacity(rest.count)
        var index = rest.startIndex
        while index < rest.endIndex {
            let byte = rest[index]
            if byte == UInt8(ascii: "%"), let h = PercentEncoding.hexValue(rest[rest.index(after: index)]),
               let l = PercentEncoding.hexValue(rest[rest.index(index, offsetBy: 2)]) {
                decoded.append(h << 4 | l)
                index = rest.index(index, offsetBy: 3)
            } else {
                decoded.append(byte)
                index = rest.index(after: index)
            }
        }
        return String(validating: decoded, as: UTF8.self) != nil
    }
}
