import Foundation

/// An RFC 6901 JSON Pointer (`/personalInformation/bpId`, `/roles/0`), evaluated over the
/// values `JSONSerialization` produces.
public struct JSONPointer: Sendable, Hashable, CustomStringConvertible {
    public let tokens: [String]
    public let description: String

    /// Parses a pointer; `nil` when it does not start with `/` or has a bad `~` escape.
    public init?(_ text: String) {
        guard text.hasPrefix("/") else { return nil }
        var tokens: [String] = []
        for raw in text.dropFirst().split(separator: "/", omittingEmptySubsequences: false) {
            var token = ""
            var iterator = raw.makeIterator()
            while let character = iterator.next() {
                guard character == "~" else { token.append(character); continue }
                switch iterator.next() {
                case "0": token.append("~")
                case "1": token.append("/")
                default: return nil
                }
            }
            tokens.append(token)
        }
        self.tokens = tokens
        self.description = text
    }

    /// The value at the pointer, or `nil` when any step is missing.
    public func evaluate(_ document: Any) -> Any? {
        var current: Any = document
        for token in tokens {
            if let object = current as? [String: Any], let next = object[token] {
                current = next
            } else if let array = current as? [Any], let index = Int(token), array.indices.contains(index) {
                current = array[index]
            } else {
                return nil
            }
        }
        return current
    }

    /// The value as text: strings as they are, numbers and booleans written out.
    public func string(in document: Any) -> String? {
        switch evaluate(document) {
        case let string as String: return string
        case let number as NSNumber:
            if String(cString: number.objCType) == "c" { return number.boolValue ? "true" : "false" }
            return number.stringValue
        default: return nil
        }
    }
}
