import GatehouseCore
import Testing

struct FormParametersTests {
    private func parse(_ text: String) throws(FormError) -> FormParameters {
        try FormParameters(parsing: Array(text.utf8))
    }

    @Test func anArtifactFieldHasItsOwnLimitAndEveryOtherFieldKeepsTheCommonOne() throws {
        let object = String(repeating: "A", count: 7400)  // a genuine App Attest object in base64
        let limits = FormParameters.Limits(fieldLimits: ["attestation_object": 16 * 1024])
        let form = try FormParameters(parsing: Array("attestation_object=\(object)&type=apple".utf8), limits: limits)
        #expect(form["attestation_object"]?.count == 7400)
        #expect(throws: FormError.tooLong("attestation_object")) {
            try FormParameters(parsing: Array("attestation_object=\(object)".utf8))
        }
        #expect(throws: FormError.tooLong("challenge")) {
            try FormParameters(parsing: Array("challenge=\(object)".utf8), limits: limits)
        }
        #expect(throws: FormError.tooLong("attestation_object")) {
            try FormParameters(parsing: Array("attestation_object=\(String(repeating: "A", count: 16 * 1024 + 1))".utf8), limits: limits)
        }
    }

    @Test func decodesPercentAndPlus() throws {
        let form = try parse("a=b%20c&d=e+f&g=%E2%9C%93")
        #expect(form["a"] == "b c")
        #expect(form["d"] == "e f")
        #expect(form["g"] == "✓")
    }

    @Test func emptyValueCountsAsAbsent() throws {
        #expect(try parse("scope=&a=1")["scope"] == nil)
    }

    @Test(arguments: [
        ("a=1&a=2", FormError.duplicated("a")),
        ("a=&a=2", FormError.duplicated("a")),
        ("a=%ZZ", FormError.malformed),
        ("a=%4", FormError.malformed),
        ("a=%FF%FE", FormError.invalidUTF8),
        ("a=%00", FormError.controlCharacter),
        ("=x", FormError.malformed),
    ])
    func refuses(_ text: String, _ expected: FormError) {
        #expect(throws: expected) { try parse(text) }
    }

    @Test func refusesOversizeValuesAndTooManyPairs() {
        let long = "code=" + String(repeating: "x", count: 5000)
        #expect(throws: FormError.tooLong("code")) { try parse(long) }
        let many = (0..<40).map { "p\($0)=1" }.joined(separator: "&")
        #expect(throws: FormError.tooManyParameters) { try parse(many) }
    }

    @Test func encodingRoundTrips() throws {
        let original = FormParameters(["redirect_uri": "com.example.app:/cb?x=1&y=2", "state": "ä ö/+"])
        #expect(try parse(original.encoded()) == original)
    }
}
