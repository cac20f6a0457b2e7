import Foundation
import GatehouseCore

/// An error of the seed's `/auth/*` contract: `{"status","message","details"?}` (broccoliapps'
/// `ApiErrorResponse`), with `Cache-Control: no-store` and, for 429 and 503, `Retry-After`.
struct CentralAPIError: Error, Equatable {
    let status: Int
    let message: String
    var details: [String] = []
    var retryAfter: Int? = nil

    static func validation(_ details: [String]) -> Self { .init(status: 400, message: "Validation Error", details: details) }

    var response: AppResponse {
        struct Body: Encodable {
            let status: Int
            let message: String
            let details: [String]?
        }
        return AppResponse(status: status, headers: retryAfter.map { [("Retry-After", String($0))] } ?? [],
                           json: JSONCoding.encode(Body(status: status, message: message, details: details.isEmpty ? nil : details)))
    }
}

/// A JSON object body of the `/auth/*` contract, checked strictly: only the endpoint's fields,
/// each of its type and size. Every problem is listed, as valibot lists its issues.
struct CentralAPIRequest {
    enum Field {
        /// A non-empty string of at most `maximum` UTF-8 bytes.
        case string(maximum: Int)
        /// An e-mail address (at most 254 bytes, one `@`, a dot in the domain, no spaces).
        case email
        /// One of a fixed set of words.
        case word([String])
        /// `{"givenName"?: string|null, "familyName"?: string|null}` (Sign in with Apple's `fullName`).
        case personName
    }

    let values: [String: Any]

    init(_ request: AppRequest, fields: [(name: String, field: Field, required: Bool)]) throws(CentralAPIError) {
        guard MediaType.matches(request.contentType, "application/json") else {
            throw CentralAPIError(status: 415, message: "The body must be application/json")
        }
        guard let body = request.body else {
            throw CentralAPIError(status: 413, message: "The body is larger than \(request.limit) bytes")
        }
        guard let parsed = try? JSONSerialization.jsonObject(with: body, options: [.fragmentsAllowed]) else {
            throw .validation(["body: is not valid JSON"])
        }
        guard let object = parsed as? [String: Any] else { throw .validation(["body: must be a JSON object"]) }
        var problems: [String] = []
        let known = Set(fields.map(\.name))
        for name in object.keys.sorted() where !known.contains(name) {
            problems.append("\(Self.printable(name)): is not a field of this request")
        }
        for (name, field, required) in fields {
            guard let value = object[name] else {
                if required { problems.append("\(name): is required") }
                continue
            }
            if let problem = Self.problem(with: value, as: field) { problems.append("\(name): \(problem)") }
        }
        guard problems.isEmpty else { throw .validation(problems) }
        values = object
    }

    subscript(_ name: String) -> String? { values[name] as? String }

    private static func problem(with value: Any, as field: Field) -> String? {
        switch field {
        case .string(let maximum):
            // `JSONSerialization` gives numbers and booleans as NSNumber, never as String.
            guard let text = value as? String else { return "must be a string" }
            if text.isEmpty { return "must not be empty" }
            if text.utf8.count > maximum { return "must be at most \(maximum) bytes" }
            return nil
        case .email:
            guard let text = value as? String else { return "must be a string" }
            return isEmail(text) ? nil : "must be an e-mail address"
        case .word(let words):
            guard let text = value as? String else { return "must be a string" }
            return words.contains(text) ? nil : "must be one of: \(words.joined(separator: ", "))"
        case .personName:
            guard let object = value as? [String: Any] else { return "must be an object" }
            for key in object.keys.sorted() where key != "givenName" && key != "familyName" {
                return "\(printable(key)) is not a member of fullName"
            }
            for key in ["givenName", "familyName"] {
                guard let member = object[key], !(member is NSNull) else { continue }
                guard let text = member as? String else { return "\(key) must be a string or null" }
                if text.utf8.count > 256 { return "\(key) must be at most 256 bytes" }
            }
            return nil
        }
    }

    /// An address the central provider accepts: `EmailAddress` is valibot's `email()` rule, the
    /// provider's `EMAIL_REGEX`.
    static func isEmail(_ text: String) -> Bool { EmailAddress.isValid(text) }

    /// A field name as it may be echoed: at most 64 characters, controls dropped.
    private static func printable(_ name: String) -> String {
        String(name.unicodeScalars.filter { $0.value >= 0x20 && $0.value != 0x7F }.prefix(64).map(Character.init))
    }
}
