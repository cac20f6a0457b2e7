/// A CBOR value (RFC 8949), as far as attestation objects and assertions use it.
///
/// No maintained Swift CBOR package is in the mirror, so this is a small decoder of what App
/// Attest sends: definite-length maps, arrays, byte and text strings, integers, and the simple
/// values false, true and null. Indefinite lengths, tags, floats and other simple values are
/// refused; depth, item count and lengths are bounded, so hostile input fails with an error.
public indirect enum CBOR: Sendable, Equatable {
    case unsigned(UInt64)
    /// A negative integer: -1 - n.
    case negative(UInt64)
    case bytes([UInt8])
    case text(String)
    case array([CBOR])
    /// Entries in the order they came.
    case map([(key: CBOR, value: CBOR)])
    case bool(Bool)
    case null

    public static func == (lhs: CBOR, rhs: CBOR) -> Bool {
        switch (lhs, rhs) {
        case (.unsigned(let a), .unsigned(let b)), (.negative(let a), .negative(let b)): a == b
        case (.bytes(let a), .bytes(let b)): a == b
        case (.text(let a), .text(let b)): a == b
        case (.array(let a), .array(let b)): a == b
        case (.map(let a), .map(let b)): a.count == b.count && zip(a, b).allSatisfy { $0.key == $1.key && $0.value == $1.value }
        case (.bool(let a), .bool(let b)): a == b
        case (.null, .null): true
        default: false
        }
    }

    /// The value of the text key `key` in a map.
    public subscript(key: String) -> CBOR? {
        guard case .map(let entries) = self else { return nil }
        return entries.first { $0.key == .text(key) }?.value
    }

    /// The value of the integer key `key` in a map (COSE keys use integers).
    public subscript(integer key: Int) -> CBOR? {
        guard case .map(let entries) = self else { return nil }
        let wanted: CBOR = key >= 0 ? .unsigned(UInt64(key)) : .negative(UInt64(-1 - key))
        return entries.first { $0.key == wanted }?.value
    }

    public var byteString: [UInt8]? {
        if case .bytes(let bytes) = self { return bytes }
        return nil
    }

    public var textString: String? {
        if case .text(let text) = self { return text }
        return nil
    }

    public var arrayValue: [CBOR]? {
        if case .array(let items) = self { return items }
        return nil
    }

    /// Decodes exactly one value filling all of `bytes`.
    public static func decode(_ bytes: [UInt8], maximumDepth: Int = 16, maximumItems: Int = 4096) throws(AttestationError) -> CBOR {
        var reader = Reader(bytes: bytes, maximumDepth: maximumDepth, itemsLeft: maximumItems)
        let value = try reader.value(depth: 0)
        guard reader.offset == bytes.count else { throw AttestationError("CBOR: bytes after the value") }
        return value
    }

    private struct Reader {
        let bytes: [UInt8]
        let maximumDepth: Int
        var itemsLeft: Int
        var offset = 0

        init(bytes: [UInt8], maximumDepth: Int, itemsLeft: Int) {
            self.bytes = bytes
            self.maximumDepth = maximumDepth
            self.itemsLeft = itemsLeft
        }

        mutating func byte() throws(AttestationError) -> UInt8 {
            guard offset < bytes.count else { throw AttestationError("CBOR: truncated") }
            defer { offset += 1 }
            return bytes[offset]
        }

        mutating func take(_ count: UInt64) throws(AttestationError) -> [UInt8] {
            guard count <= UInt64(bytes.count - offset) else { throw AttestationError("CBOR: a length runs past the end") }
            let end = offset + Int(count)
            defer { offset = end }
            return Array(bytes[offset..<end])
        }

        /// The argument of an initial byte (RFC 8949 §3): inline, or 1, 2, 4 or 8 bytes after it.
        mutating func argument(_ additional: UInt8) throws(AttestationError) -> UInt64 {
            switch additional {
            case 0..<24: return UInt64(additional)
            case 24, 25, 26, 27:
                let size = 1 << Int(additional - 24)
                var value: UInt64 = 0
                for byte in try take(UInt64(size)) { value = value << 8 | UInt64(byte) }
                return value
            case 31: throw AttestationError("CBOR: indefinite lengths are not accepted")
            default: throw AttestationError("CBOR: reserved additional information \(additional)")
            }
        }

        mutating func value(depth: Int) throws(AttestationError) -> CBOR {
            guard depth <= maximumDepth else { throw AttestationError("CBOR: nested too deep") }
            guard itemsLeft > 0 else { throw AttestationError("CBOR: too many items") }
            itemsLeft -= 1
            let initial = try byte()
            let major = initial >> 5, additional = initial & 0x1F
            switch major {
            case 0: return .unsigned(try argument(additional))
            case 1: return .negative(try argument(additional))
            case 2: return .bytes(try take(try argument(additional)))
            case 3:
                guard let text = String(validating: try take(try argument(additional)), as: UTF8.self) else {
                    throw AttestationError("CBOR: a text string is not UTF-8")
                }
                return .text(text)
            case 4:
                let count = try argument(additional)
                guard count <= UInt64(itemsLeft) else { throw AttestationError("CBOR: too many items") }
                var items: [CBOR] = []
                for _ in 0..<count { items.append(try value(depth: depth + 1)) }
                return .array(items)
            case 5:
                let count = try argument(additional)
                guard count <= UInt64(itemsLeft / 2) else { throw AttestationError("CBOR: too many items") }
                var entries: [(key: CBOR, value: CBOR)] = []
                for _ in 0..<count {
                    let key = try value(depth: depth + 1)
                    guard !entries.contains(where: { $0.key == key }) else { throw AttestationError("CBOR: a map repeats a key") }
                    entries.append((key, try value(depth: depth + 1)))
                }
                return .map(entries)
            case 6: throw AttestationError("CBOR: tags are not accepted")
            default:
                switch additional {
                case 20: return .bool(false)
                case 21: return .bool(true)
                case 22: return .null
                default: throw AttestationError("CBOR: floats and other simple values are not accepted")
                }
            }
        }
    }
}
