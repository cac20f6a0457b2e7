import Logging

/// One JSON log line built byte by byte: `{"ts":…,"level":…,"label":…,"msg":…, metadata…}\n`.
///
/// Strings are escaped as RFC 8259 §7 requires (quote, backslash, every control character)
/// and, beyond it, DEL and U+2028/U+2029 (line separators to JavaScript and to some log
/// shippers), so a line never breaks whatever a message or a metadata value holds. Metadata
/// values are written as strings: a nested dictionary or array becomes the JSON text of it.
/// No Foundation encoder: a line costs one buffer.
struct JSONLogLine {
    private(set) var bytes: [UInt8]
    private var fields = 0

    /// Keys the line itself uses; metadata under one of them is written as `metadata.<key>`.
    static let reservedKeys: Set<String> = ["ts", "level", "label", "msg"]

    init(capacity: Int = 256) {
        bytes = []
        bytes.reserveCapacity(capacity)
        bytes.append(UInt8(ascii: "{"))
    }

    /// Adds `"key":"value"`.
    mutating func field(_ key: String, _ value: String) {
        separate()
        Self.appendString(key, to: &bytes)
        bytes.append(UInt8(ascii: ":"))
        Self.appendString(value, to: &bytes)
    }

    /// Adds `"key":"<JSON text of value>"`: a metadata value, always a string.
    mutating func field(_ key: String, metadata value: Logger.MetadataValue) {
        switch value {
        case .string(let string):
            field(key, string)
        case .stringConvertible(let convertible):
            field(key, convertible.description)
        case .dictionary, .array:
            var nested: [UInt8] = []
            Self.appendJSON(value, to: &nested)
            field(key, String(decoding: nested, as: UTF8.self))
        }
    }

    /// The finished line, closing brace and newline included.
    mutating func finish() -> [UInt8] {
        bytes.append(UInt8(ascii: "}"))
        bytes.append(UInt8(ascii: "\n"))
        return bytes
    }

    private mutating func separate() {
        if fields > 0 { bytes.append(UInt8(ascii: ",")) }
        fields += 1
    }

    /// A metadata value as JSON: strings as strings, dictionaries as objects (keys sorted), arrays as arrays.
    static func appendJSON(_ value: Logger.MetadataValue, to bytes: inout [UInt8]) {
        switch value {
        case .string(let string):
            appendString(string, to: &bytes)
        case .stringConvertible(let convertible):
            appendString(convertible.description, to: &bytes)
        case .dictionary(let dictionary):
            bytes.append(UInt8(ascii: "{"))
            for (index, key) in dictionary.keys.sorted().enumerated() {
                if index > 0 { bytes.append(UInt8(ascii: ",")) }
                appendString(key, to: &bytes)
                bytes.append(UInt8(ascii: ":"))
                if let nested = dictionary[key] { appendJSON(nested, to: &bytes) }
            }
            bytes.append(UInt8(ascii: "}"))
        case .array(let array):
            bytes.append(UInt8(ascii: "["))
            for (index, element) in array.enumerated() {
                if index > 0 { bytes.append(UInt8(ascii: ",")) }
                appendJSON(element, to: &bytes)
            }
            bytes.append(UInt8(ascii: "]"))
        }
    }

    private static let hexDigits: [UInt8] = Array("0123456789abcdef".utf8)

    /// `string` as a JSON string literal. Swift strings are valid UTF-8, so bytes at or above
    /// 0x80 are copied as they are, except the three-byte forms of U+2028 and U+2029. Runs of
    /// plain bytes are copied at once.
    static func appendString(_ string: String, to bytes: inout [UInt8]) {
        bytes.append(UInt8(ascii: "\""))
        var string = string
        string.withUTF8 { appendEscaped($0, to: &bytes) }
        bytes.append(UInt8(ascii: "\""))
    }

    private static func appendEscaped(_ utf8: UnsafeBufferPointer<UInt8>, to bytes: inout [UInt8]) {
        var runStart = 0
        var index = 0
        while index < utf8.count {
            let byte = utf8[index]
            if byte >= 0x20, byte != UInt8(ascii: "\""), byte != UInt8(ascii: "\\"), byte != 0x7F, byte != 0xE2 {
                index += 1
                continue
            }
            if byte == 0xE2 {
                guard index + 2 < utf8.count, utf8[index + 1] == 0x80, utf8[index + 2] == 0xA8 || utf8[index + 2] == 0xA9 else {
                    index += 1
                    continue
                }
                bytes.append(contentsOf: UnsafeBufferPointer(rebasing: utf8[runStart..<index]))
                bytes.append(contentsOf: utf8[index + 2] == 0xA8 ? lineSeparator : paragraphSeparator)
                index += 3
                runStart = index
                continue
            }
            bytes.append(contentsOf: UnsafeBufferPointer(rebasing: utf8[runStart..<index]))
            appendEscape(of: byte, to: &bytes)
            index += 1
            runStart = index
        }
        bytes.append(contentsOf: UnsafeBufferPointer(rebasing: utf8[runStart..<utf8.count]))
    }

    private static let lineSeparator: [UInt8] = Array(#"\u2028"#.utf8)
    private static let paragraphSeparator: [UInt8] = Array(#"\u2029"#.utf8)

    /// The escape of a quote, a backslash, a control character or DEL.
    private static func appendEscape(of byte: UInt8, to bytes: inout [UInt8]) {
        bytes.append(UInt8(ascii: "\\"))
        switch byte {
        case UInt8(ascii: "\""), UInt8(ascii: "\\"): bytes.append(byte)
        case UInt8(ascii: "\n"): bytes.append(UInt8(ascii: "n"))
        case UInt8(ascii: "\r"): bytes.append(UInt8(ascii: "r"))
        case UInt8(ascii: "\t"): bytes.append(UInt8(ascii: "t"))
        default:
            bytes.append(contentsOf: [UInt8(ascii: "u"), UInt8(ascii: "0"), UInt8(ascii: "0")])
            bytes.append(hexDigits[Int(byte >> 4)])
            bytes.append(hexDigits[Int(byte & 0x0F)])
        }
    }
}
