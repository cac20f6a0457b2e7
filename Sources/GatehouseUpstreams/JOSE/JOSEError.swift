/// Why an ID token, a userinfo answer or a key set was refused.
///
/// `check` names the failed rule in the words the app sees in `error_description`: "nonce", "aud",
/// "azp", "iss", "alg", "signature", "exp", "iat", "acr", "at_hash", "kid", "sub",
/// "userinfo signature", "userinfo sub", "malformed", "jwks". `unavailable` is true only when a key
/// set could not be fetched (network, non-200, not a key set): the caller answers 503
/// (`temporarily_unavailable`), never a sign-in error. `detail` is for logs; it never holds a
/// token or a secret.
public struct JOSEError: Error, Sendable, Equatable, CustomStringConvertible {
    public let check: String
    public let detail: String
    public let unavailable: Bool

    public init(check: String, detail: String, unavailable: Bool = false) {
        self.check = check
        self.detail = detail
        self.unavailable = unavailable
    }

    /// The key set could not be fetched: answered 503, never shown as a sign-in error.
    public static func keySetUnavailable(_ detail: String) -> JOSEError {
        JOSEError(check: "jwks", detail: detail, unavailable: true)
    }

    public var description: String {
        unavailable ? "key set unavailable: \(detail)" : "\(check): \(detail)"
    }
}
