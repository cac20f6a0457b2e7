/// Parameters of an `application/x-www-form-urlencoded` body or a query string, read strictly.
///
/// OAuth is picky about its parameters and so is this parser: a parameter given twice is an
/// error (RFC 6749 §3.1), so is a broken `%` escape, invalid UTF-8, a name or value over the
/// limit, or too many pairs. A parameter with an empty value counts as absent (RFC 6749 §3.1).
public struct FormParameters: Sendable, Equatable {
    /// How much a request may carry before it is refused.
    public struct Limits: Sendable, Equatable {
        public var maximumPairs: Int
        public var maximumValueBytes: Int
        /// Larger limits for the few fields that carry whole artifacts (an App Attest attestation
        /// object with its receipt, a Play Integrity token); every other field keeps `maximumValueBytes`.
        public var fieldLimits: [String: Int]

        public init(maximumPairs: Int = 32, maximumValueBytes: Int = 4096, fieldLimits: [String: Int] = [:]) {
            self.maximumPairs = maximumPairs
            self.maximumValueBytes = maximumValueBytes
            self.fieldLimits = fieldLimits
        }

        func limit(of name: String) -> Int { fieldLimits[name] ?? maximumValueBytes }
    }

    private var values: [String: String]

    /// Parameters built directly, for tests and redirects.
    public init(_ values: [String: String] = [:]) {
        self.values = values
    }

    /// Parses a query string or form body.
    /// With `recognizing`, parameters of any other name are skipped unread, malformed or
    /// repeated ones included (RFC 6749 §3.1 and §3.2: a server MUST ignore unrecognized
    /// parameters); the rules above then hold for the recognized ones only.
    public init(parsing bytes: some Collection<UInt8>, limits: Limits = Limits(), recognizing: Set<String>? = nil) throws(FormError) {
        var values: [String: String] = [:]
        var pairs = 0
        for pair in bytes.split(separator: UInt8(ascii: "&"), omittingEmptySubsequences: true) {
            pairs += 1
            guard pairs <= limits.maximumPairs else { throw .tooManyParameters }
            let parts = pair.split(separator: UInt8(ascii: "="), maxSplits: 1, omittingEmptySubsequences: false)
            let name: String
            if let recognizing {
                guard let decoded = try? Self.decode(parts[0], limit: 128, field: nil), recognizing.contains(decoded) else { continue }
                name = decoded
            } else {
                name = try Self.decode(parts[0], limit: 128, field: nil)
            }
            let value = parts.count > 1 ? try Self.decode(parts[1], limit: limits.limit(of: name), field: name) : ""
            guard !name.isEmpty else { throw .malformed }
            guard values[name] == nil else { throw .duplicated(name) }
            values[name] = value
        }
        // Checked before empty values are dropped, so `a=&a=x` is still a duplicate.
        self.values = values.filter { !$0.value.isEmpty }
    }

    /// The value of a parameter, `nil` when absent or empty.
    public subscript(_ name: String) -> String? {
        values[name]
    }

    /// The names present, for refusing parameters an endpoint does not take.
    public var names: Set<String> { Set(values.keys) }

    /// `name=value&…` with RFC 3986 unreserved characters left as they are.
    public func encoded() -> String {
        Self.encode(pairs: values.sorted { $0.key < $1.key }.map { ($0.key, $0.value) })
    }

    /// `name=value&…` of `pairs`, in their order, each name and value percent-encoded (`encode`):
    /// a form body, or a query.
    public static func encode(pairs: [(String, String)]) -> String {
        pairs.map { "\(encode($0.0))=\(encode($0.1))" }.joined(separator: "&")
    }

    /// Percent-encodes everything but the unreserved characters of RFC 3986 §2.3.
    public static func encode(_ text: String) -> String {
        var output = ""
        output.reserveCapacity(text.utf8.count)
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"),
                UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "."),
                UInt8(ascii: "_"), UInt8(ascii: "~"):
                output.unicodeScalars.append(Unicode.Scalar(byte))
            default:
                output += "%" + String(byte, radix: 16, uppercase: true).leftPadded(to: 2)
            }
        }
        return output
    }

    private static func decode(_ bytes: some Collection<UInt8>, limit: Int, field: String?) throws(FormError) -> String {
        var output: [UInt8] = []
        output.reserveCapacity(bytes.count)
        var iterator = bytes.makeIterator()
        while let byte = iterator.next() {
            switch byte {
            case UInt8(ascii: "+"):
                output.append(UInt8(ascii: " "))
            case UInt8(ascii: "%"):
                guard let high = iterator.next().flatMap(PercentEncoding.hexValue), let low = iterator.next().flatMap(PercentEncoding.hexValue) else {
                    throw .malformed
                }
                output.append(high << 4 | low)
            default:
                output.append(byte)
            }
            if output.count > limit { throw field.map { .tooLong($0) } ?? .malformed }
        }
        guard let text = String(validating: output, as: UTF8.self) else { throw .invalidUTF8 }
        guard !text.unicodeScalars.contains(where: { $0.value < 0x20 || $0.value == 0x7F }) else {
            throw .controlCharacter
        }
        return text
    }
}

/// Why a query string or form body was refused.
public enum FormError: Error, Sendable, Equatable, CustomStringConvertible {
    case malformed
    case invalidUTF8
    case controlCharacter
    case duplicated(String)
    case tooLong(String)
    case tooManyParameters

    public var description: String {
        switch self {
        case .malformed: "the parameters are not well-formed form encoding"
        case .invalidUTF8: "a parameter is not valid UTF-8"
        case .controlCharacter: "a parameter contains a control character"
        case .duplicated(let name): "the parameter '\(name)' is given more than once"
        case .tooLong(let name): "the parameter '\(name)' is too long"
        case .tooManyParameters: "too many parameters"
        }
    }
}

extension String {
    fileprivate func leftPadded(to width: Int) -> String {
        count >= width ? self : String(repeating: "0", count: width - count) + self
    }
}
