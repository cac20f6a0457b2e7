import Foundation
import GatehouseCore
import GatehouseUpstreams
import HTTPTypes
import Hummingbird
import Logging

/// In-app sign-in: the Authorization Challenge Endpoint of OAuth 2.0 for First-Party
/// Applications (draft-ietf-oauth-first-party-apps-04), in front of whatever the app's upstream
/// can do without a browser (`UpstreamProfile.inAppSignIn`): a password relayed once, the
/// upstream's second factor, its e-mailed link; Gatehouse's own unblock code on top; the browser
/// (`redirect_to_web`) for everything else. The dialogue ends in an ordinary Gatehouse code,
/// redeemed at `/oauth/token` without `redirect_uri`. Built when an app has `in_app_sign_in: on`.
struct InAppSignIn: RecordingFeature {
    let configuration: GatehouseConfiguration
    let store: any GatehouseStore
    let upstreams: [String: any UpstreamProfile]
    let now: @Sendable () -> Date
    let logger: Logger
    let audit: AuditLog
    let limits: RateLimiters
    let dpop: DPoPEnforcement
    /// The mail relay of unblock codes (the configuration requires one).
    let mailer: (any Mailer)?
    /// App instances, when an app has them: an instance signs in only while live, and an
    /// uncertified one passes an unblock code first.
    let instances: AppInstances?

    static let path = "/oauth/authorize-challenge"

    /// Every parameter the endpoint reads; others are ignored (RFC 6749 §3.1).
    static let parameterNames: Set<String> = AuthorizationRequest.parameterNames
        .union(["login_hint", "auth_session", "resend"]).union(ChallengeStep.inputFields)

    var settings: InAppSignInSettings { configuration.inAppSignIn }
}

/// One answer of the endpoint: JSON, `Cache-Control: no-store`, `Pragma: no-cache`.
struct ChallengeAnswer {
    var status: Int
    var body: [String: ChallengeValue]
    var retryAfter: Int?
    var dpopNonce: String?

    enum ChallengeValue: Encodable {
        case string(String)
        case number(Int)
        case flag(Bool)

        func encode(to encoder: any Encoder) throws {
            var container = encoder.singleValueContainer()
            switch self {
            case .string(let text): try container.encode(text)
            case .number(let number): try container.encode(number)
            case .flag(let value): try container.encode(value)
            }
        }
    }

    /// Done: the code for `/oauth/token`.
    static func code(_ code: String) -> ChallengeAnswer {
        ChallengeAnswer(status: 200, body: ["authorization_code": .string(code)])
    }

    /// The next step, with the failure of the previous input when there was one.
    static func next(_ step: ChallengeStep, session: String, failure: InAppFailure? = nil) -> ChallengeAnswer {
        var body: [String: ChallengeValue] = [
            "error": .string("insufficient_authorization"), "auth_session": .string(session), "step": .string(step.rawValue),
            "error_description": .string(failure.map(Self.describe) ?? Self.ask(step)),
        ]
        if let failure { body["failure"] = .string(failure.rawValue) }
        return ChallengeAnswer(status: 403, body: body)
    }

    /// The dialogue cannot go on in the app: the browser.
    static func redirectToWeb(requestURI: String?, expiresIn: Int) -> ChallengeAnswer {
        var body: [String: ChallengeValue] = [
            "error": .string("redirect_to_web"),
            "error_description": .string("This sign-in continues in the browser."),
        ]
        if let requestURI {
            body["request_uri"] = .string(requestURI)
            body["expires_in"] = .number(expiresIn)
        }
        return ChallengeAnswer(status: 403, body: body)
    }

    /// A catalog failure that is not a step's wrong input (limits, the upstream, the mail relay),
    /// with the next `auth_session` when the dialogue goes on; `ended` when it is over.
    static func failed(_ failure: InAppFailure, session: String?, retryAfter: Int? = nil, ended: Bool = false) -> ChallengeAnswer {
        let code = switch failure {
        case .authenticationFailure: "server_error"
        case .invalidEmailAddress: "invalid_request"
        case .accountRefused: "access_denied"
        default: "temporarily_unavailable"
        }
        var body: [String: ChallengeValue] = [
            "error": .string(code), "failure": .string(failure.rawValue), "error_description": .string(describe(failure)),
        ]
        if let session { body["auth_session"] = .string(session) }
        if let retryAfter { body["retry_after"] = .number(retryAfter) }
        if ended { body["dialogue_ended"] = .flag(true) }
        return ChallengeAnswer(status: failure.status, body: body, retryAfter: retryAfter)
    }

    /// An OAuth error of the request itself (RFC 6749 §5.2, the draft's `invalid_session`), with
    /// the next `auth_session` when the dialogue goes on.
    static func refused(_ error: OAuthError, session: String? = nil, ended: Bool = false) -> ChallengeAnswer {
        var body: [String: ChallengeValue] = ["error": .string(error.code), "error_description": .string(Self.printable(error.detail))]
        if let session { body["auth_session"] = .string(session) }
        if ended { body["dialogue_ended"] = .flag(true) }
        return ChallengeAnswer(status: error.status, body: body, retryAfter: error.retryAfter, dpopNonce: error.dpopNonce)
    }

    /// The upstream refused the account itself, told to a user who has passed a second factor:
    /// what to do, and `reason` for the app's screen. The dialogue is over.
    static func accountRefused(_ reason: AccountRefusal) -> ChallengeAnswer {
        var answer = failed(.accountRefused, session: nil, ended: true)
        answer.body["reason"] = .string(reason.rawValue)
        let description = switch reason {
        case .blocked: "The sign-in service has blocked this account: contact the app's support."
        case .locked: "The sign-in service has locked this account after failed attempts: follow the e-mail it sent to unlock it."
        case .passwordLeaked: "This password appeared in a data breach elsewhere: reset it, then sign in with the new one."
        case .denied: "The sign-in service refused this sign-in: contact the app's support, or sign in in the browser."
        }
        answer.body["error_description"] = .string(description)
        return answer
    }

    static let invalidSession = ChallengeAnswer(status: 400, body: [
        "error": .string("invalid_session"),
        "error_description": .string("The auth_session is unknown, already used, expired, or another app's: start again."),
        "dialogue_ended": .flag(true),
    ])

    /// A description within the characters the draft allows (`%x20-21 / %x23-5B / %x5D-7E`):
    /// anything else (an echoed scope's quote or accent) becomes `?`.
    static func printable(_ text: String) -> String {
        String(text.unicodeScalars.map { scalar in
            let value = scalar.value
            let allowed = (0x20...0x7E).contains(value) && value != 0x22 && value != 0x5C
            return allowed ? Character(scalar) : "?"
        })
    }

    /// A code's answer is plain JSON; every other is an OAuth error's, with its headers.
    var response: Response {
        status == 200 ? .oauthJSON(JSONCoding.encode(body))
            : .oauthError(JSONCoding.encode(body), status: status, retryAfter: retryAfter, dpopNonce: dpopNonce)
    }

    /// A string member of the body (for the log).
    func string(_ name: String) -> String? {
        if case .string(let text)? = body[name] { return text }
        return nil
    }

    static func ask(_ step: ChallengeStep) -> String {
        switch step {
        case .password: "Send the account's password."
        case .unblockCode: "A code was e-mailed to the account's address: send it, with the password."
        case .otp: "Send the 6-digit code of the account's authenticator app."
        case .emailLink: "A sign-in link was e-mailed to the account's address: send the code it hands to the app."
        }
    }

    static func describe(_ failure: InAppFailure) -> String {
        switch failure {
        case .incorrectPassword: "The password is incorrect."
        case .invalidUnblockCode: "The unblock code is wrong or has expired."
        case .invalidTOTPCode: "The code is wrong."
        case .invalidEmailCode: "The link's code is wrong or has expired: ask for a new link."
        case .invalidEmailAddress: "login_hint must be an e-mail address for this sign-in."
        case .tooManyRequests: "Too many attempts: wait before trying again."
        case .failedToSendEmail: "Gatehouse could not send the e-mail right now."
        case .serverUnavailable: "The sign-in service cannot be reached right now."
        case .requestTimeout: "The sign-in service did not answer in time."
        case .authenticationFailure: "The sign-in could not be completed: start again, or sign in in the browser."
        case .accountRefused: "The sign-in service refused this account."
        }
    }
}
