/// What went wrong, one case per `failure` code of the error catalog of docs/in-app-sign-in.md,
/// plus the client's own. No case ever carries a password, a code or an `auth_session`.
public enum SignInError: Error, Equatable, Sendable {
    /// `incorrect_password`: ask for the password again.
    case incorrectPassword
    /// `invalid_unblock_code`: ask for the code again, or resend it.
    case invalidUnblockCode
    /// `invalid_totp_code`: ask for the code again.
    case invalidTotpCode
    /// `invalid_email_code`: ask for a new link (resend).
    case invalidEmailCode
    /// `invalid_email_address`: ask for the address again (the dialogue starts over).
    case invalidEmailAddress
    /// `too_many_requests`: wait `retryAfter` seconds (when known), then try again.
    case tooManyRequests(retryAfter: Int?)
    /// `failed_to_send_email`: try the same step again later.
    case failedToSendEmail
    /// `server_unavailable`: try again later.
    case serverUnavailable
    /// `request_timeout`: try again.
    case requestTimeout
    /// `authentication_failure`: the upstream's answer (or the token exchange) was unusable:
    /// start over or use the browser.
    case authenticationFailure
    /// `account_refused`: the sign-in service refused the account (`reason`: `blocked`, `locked`,
    /// `password_leaked`, `denied`); show the answer's description: reset the password, follow
    /// the service's e-mail, or contact support. Told only after a second factor was passed.
    case accountRefused(reason: String?)
    /// `invalid_session`: the dialogue is unknown, used or expired: the client is back at `start`.
    case invalidSession
    /// No answer at all (no connection, TLS failure, timeout of the transport).
    case network
    /// The method cannot be called in the current state (or while a request is under way); nothing was sent.
    case invalidState
    /// Anything else: an answer the contract does not have (a bug in the app or the server).
    /// The text is a wire error code or a short fixed phrase, never user input.
    case unexpected(String)

    /// The machine code: the catalog's `failure` code, or `invalid_session`, `network`,
    /// `invalid_state`, `unexpected`.
    public var code: String {
        switch self {
        case .incorrectPassword: "incorrect_password"
        case .invalidUnblockCode: "invalid_unblock_code"
        case .invalidTotpCode: "invalid_totp_code"
        case .invalidEmailCode: "invalid_email_code"
        case .invalidEmailAddress: "invalid_email_address"
        case .tooManyRequests: "too_many_requests"
        case .failedToSendEmail: "failed_to_send_email"
        case .serverUnavailable: "server_unavailable"
        case .requestTimeout: "request_timeout"
        case .authenticationFailure: "authentication_failure"
        case .accountRefused: "account_refused"
        case .invalidSession: "invalid_session"
        case .network: "network"
        case .invalidState: "invalid_state"
        case .unexpected: "unexpected"
        }
    }

    /// Whether the user may try again (the catalog's "retry" column; `tooManyRequests` after the
    /// wait). `invalidSession` needs a new dialogue, `authenticationFailure` a new dialogue or the
    /// browser; `invalidState` and `unexpected` are bugs.
    public var canRetry: Bool {
        switch self {
        case .incorrectPassword, .invalidUnblockCode, .invalidTotpCode, .invalidEmailCode, .invalidEmailAddress,
             .tooManyRequests, .failedToSendEmail, .serverUnavailable, .requestTimeout, .network:
            true
        case .authenticationFailure, .accountRefused, .invalidSession, .invalidState, .unexpected:
            false
        }
    }

    /// The seconds to wait before trying again, for `tooManyRequests`.
    public var retryAfter: Int? {
        if case .tooManyRequests(let seconds) = self { return seconds }
        return nil
    }

    /// The catalog's error for a `failure` code; `unexpected(failure)` for a code it does not have.
    public init(failure: String, retryAfter: Int? = nil, reason: String? = nil) {
        self = switch failure {
        case "incorrect_password": .incorrectPassword
        case "invalid_unblock_code": .invalidUnblockCode
        case "invalid_totp_code": .invalidTotpCode
        case "invalid_email_code": .invalidEmailCode
        case "invalid_email_address": .invalidEmailAddress
        case "too_many_requests": .tooManyRequests(retryAfter: retryAfter)
        case "failed_to_send_email": .failedToSendEmail
        case "server_unavailable": .serverUnavailable
        case "request_timeout": .requestTimeout
        case "authentication_failure": .authenticationFailure
        case "account_refused": .accountRefused(reason: reason)
        case "invalid_session": .invalidSession
        default: .unexpected(failure)
        }
    }
}

extension SignInError: CustomStringConvertible {
    /// The code and the seed's wording.
    public var description: String {
        let text = switch self {
        case .incorrectPassword: "Incorrect password"
        case .invalidUnblockCode: "Invalid unblock code"
        case .invalidTotpCode: "Invalid TOTP code"
        case .invalidEmailCode: "Invalid or expired verification code"
        case .invalidEmailAddress: "Invalid email address"
        case .tooManyRequests(let seconds): "Too many requests" + (seconds.map { " (retry after \($0) s)" } ?? "")
        case .failedToSendEmail: "Failed to send email"
        case .serverUnavailable: "Server unavailable"
        case .requestTimeout: "Request Timeout"
        case .authenticationFailure: "Authentication failure"
        case .accountRefused(let reason): "The sign-in service refused the account" + (reason.map { " (\($0))" } ?? "")
        case .invalidSession: "The sign-in expired: start again"
        case .network: "No connection to the server"
        case .invalidState: "Not possible in the current state"
        case .unexpected(let detail): detail
        }
        return "\(code): \(text)"
    }
}
