import Foundation

/// Media types as a `Content-Type` field carries them (RFC 9110 §8.3.1).
public enum MediaType {
    /// Whether `contentType` names `type` (lowercase), whatever its parameters and its case.
    public static func matches(_ contentType: String?, _ type: String) -> Bool {
        contentType?.lowercased().split(separator: ";").first?.trimmingCharacters(in: .whitespaces) == type
    }
}
