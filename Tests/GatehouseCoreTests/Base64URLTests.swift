import Foundation
import GatehouseCore
import Testing

struct Base64URLTests {
    /// What the decoder answered before it worked on bytes (Foundation's base64 after swapping
    /// the alphabet): the one-pass decoder must accept and refuse exactly the same texts.
    static func foundationDecode(_ text: String) -> Data? {
        var base64 = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        guard !base64.contains("="), !text.contains("+"), !text.contains("/") else { return nil }
        base64 += String(repeating: "=", count: (4 - base64.count % 4) % 4)
        return Data(base64Encoded: base64)
    }

    @Test func everyLengthRoundTrips() {
        for length in 0..<200 {
            let bytes = (0..<length).map { _ in UInt8.random(in: 0...255) }
            #expect(Base64URL.decode(Base64URL.encode(bytes)) == Data(bytes))
        }
    }

    @Test func acceptsAndRefusesWhatFoundationDid() {
        let characters = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_") + ["+", "/", "=", " ", ".", "é", "\n", "\0"]
        var generator = SystemRandomNumberGenerator()
        for round in 0..<5_000 {
            let length = Int.random(in: 0..<24, using: &generator)
            let text = String((0..<length).map { _ in
                round % 3 == 0 ? characters.randomElement(using: &generator)! : characters[Int.random(in: 0..<64, using: &generator)]
            })
            #expect(Base64URL.decode(text) == Self.foundationDecode(text), "\(text.debugDescription)")
        }
    }

    @Test(arguments: ["", "QQ", "QUI", "QUJD", "QUJDRA", "-_-_", "A", "QQ==", "QQ=", "Q+/A", "QU JD", "QUJDé"])
    func knownTexts(_ text: String) {
        #expect(Base64URL.decode(text) == Self.foundationDecode(text))
    }
}
