public import Foundation

/// JSON as Gatehouse writes it: keys sorted, slashes unescaped.
public enum JSONCoding {
    public static func encode(_ value: some Encodable) -> Data {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        // Encoding plain dictionaries and structs of strings cannot fail.
        return (try? encoder.encode(value)) ?? Data("{}".utf8)
    }
}
