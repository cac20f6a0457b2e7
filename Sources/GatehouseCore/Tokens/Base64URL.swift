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

    /// Decodes unpadded base64url; `nil` when the text is not base64url (any byte outside the
    /// alphabet, padding, or a length no encoding has). One pass over the UTF-8 bytes: a DPoP
    /// proof on the relay's fast path decodes three of these per request.
    public static func decode(_ text: String) -> Data? {
        decode(text[...])
    }

    /// `decode` of a part of a text (a JWT's segment), without copying it out first.
    public static func decode(_ text: Substring) -> Data? {
        var text = text
        return text.withUTF8 { decode(utf8: $0) }
    }

    /// `decode` over UTF-8 bytes.
    public static func decode(utf8 input: UnsafeBufferPointer<UInt8>) -> Data? {
        let count = input.count
        guard count % 4 != 1 else { return nil }
        var output = Data(count: count * 3 / 4)
        let valid = output.withUnsafeMutableBytes { (buffer: UnsafeMutableRawBufferPointer) -> Bool in
            var written = 0
            var word: UInt32 = 0
            var bits = 0
            for byte in input {
                let value = decoding[Int(byte)]
                guard value < 64 else { return false }
                word = word << 6 | UInt32(value)
                bits += 6
                if bits >= 8 {
                    bits -= 8
                    buffer[written] = UInt8(truncatingIfNeeded: word >> UInt32(bits))
                    written += 1
                }
            }
            return true
        }
        return valid ? output : nil
    }

    /// Each byte's value in the alphabet; 255 for a byte outside it.
    private static let decoding: [UInt8] = {
        var table = [UInt8](repeating: 255, count: 256)
        for (index, byte) in alphabet.enumerated() { table[Int(byte)] = UInt8(index) }
        return table
    }()
}
