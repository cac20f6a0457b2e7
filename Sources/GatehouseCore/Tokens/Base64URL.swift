public import Foundation

/// Base64url without padding (RFC 4648 §5), the alphabet of PKCE values and Gatehouse's tokens.
public enum Base64URL {
    /// Encodes bytes as unpadded base64url.
    public static func encode<Bytes: Sequence<UInt8>>(_ bytes: Bytes) -> String {
        let input = Array(bytes)
        var output: [UInt8] = []
        output.reserveCapacity((input.count * 4 + 2) / 3)
        var index = 0
        while index + 2 < input.count {
            let word = UInt32(input[index]) << 16 | UInt32(input[index + 1]) << 8 | UInt32(input[index + 2])
            output += [alphabet[Int(word >> 18 & 63)], alphabet[Int(word >> 12 & 63)], alphabet[Int(word >> 6 & 63)], alphabet[Int(word & 63)]]
            index += 3
        }
        let remaining = input.count - index
        if remaining > 0 {
            let word = UInt32(input[index]) << 16 | (remaining == 2 ? UInt32(input[index + 1]) << 8 : 0)
            output += [alphabet[Int(word >> 18 & 63)], alphabet[Int(word >> 12 & 63)]]
            if remaining == 2 { output.append(alphabet[Int(word >> 6 & 63)]) }
        }
        return String(decoding: output, as: UTF8.self)
    }

    private static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)

    /// Decodes unpadded (or padded) base64url; `nil` when the text is not base64url.
    public static func decode(_ text: String) -> Data? {
        var base64 = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        guard !base64.contains("="), !text.contains("+"), !text.contains("/") else { return nil }
        base64 += String(repeating: "=", count: (4 - base64.count % 4) % 4)
        return Data(base64Encoded: base64)
    }
}
