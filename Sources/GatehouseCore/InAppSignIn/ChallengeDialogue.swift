public import Foundation

/// What the app must send next at the authorization challenge endpoint (the `step` of an
/// `insufficient_authorization` answer).
public enum ChallengeStep: String, Sendable, Codable, CaseIterable {
    /// The account's password, relayed once to the upstream.
    case password
    /// The 6-digit code Gatehouse e-mailed (with the password again).
    case unblockCode = "unblock_code"
    /// The 6-digit TOTP code of the upstream's second factor.
    case otp
    /// The code the upstream's e-mailed link handed to the app.
    case emailLink = "email_link"

    /// The form field that carries this step's input.
    public var field: String {
        switch self {
        case .password: "password"
        case .unblockCode: "unblock_code"
        case .otp: "otp"
        case .emailLink: "email_code"
        }
    }

    /// Every step's input field: a request may carry only its own step's (and `password` with an unblock code).
    public static let inputFields: Set<String> = Set(allCases.map(\.field))
}

/// One in-app sign-in between two requests: everything the next request needs, sealed under its
/// `auth_session` and kept in the store under the hash of that value, for one use. The store
/// never holds the `auth_session`, the account, the upstream's second-factor token nor the
/// e-mailed code in clear; no password is ever kept.
public struct ChallengeDialogue: Sendable, Codable, Equatable {
    public var clientID: String
    public var upstream: String
    public var scopes: [String]
    public var codeChallenge: String
    public var appNonce: String?
    /// The account (`login_hint`).
    public var login: String
    public var step: ChallengeStep
    /// The RFC 7638 thumbprint of the DPoP key of the first request; every later request and the
    /// token request must prove the same key.
    public var dpopJKT: String?
    /// Wrong inputs so far.
    public var attempts: Int
    /// E-mails sent so far (unblock codes, links).
    public var emails: Int
    /// The upstream's token for the second factor (`mfa_token`), while step is `otp`.
    public var secondFactor: String?
    /// The SHA-256 of the e-mailed unblock code and when it stops being valid.
    public var unblockCodeHash: String?
    public var unblockExpiresAt: Date?

    public init(clientID: String, upstream: String, scopes: [String], codeChallenge: String, appNonce: String?, login: String,
                step: ChallengeStep, dpopJKT: String?) {
        self.clientID = clientID
        self.upstream = upstream
        self.scopes = scopes
        self.codeChallenge = codeChallenge
        self.appNonce = appNonce
        self.login = login
        self.step = step
        self.dpopJKT = dpopJKT
        self.attempts = 0
        self.emails = 0
    }

    private static let sealPurpose = "gatehouse challenge-dialogue v1"

    /// The store key of the dialogue continued by `authSession` (its SHA-256, namespaced apart
    /// from authorization transactions, which share the table).
    public static func storeKey(authSession: String) -> String { "challenge." + SecureToken.hash(authSession) }

    public func sealed(with authSession: String) throws -> Data {
        try TokenSeal.seal(JSONEncoder().encode(self), with: authSession, purpose: Self.sealPurpose)
    }

    public static func unsealed(_ sealed: Data, with authSession: String) throws -> ChallengeDialogue {
        try JSONDecoder().decode(ChallengeDialogue.self, from: TokenSeal.open(sealed, with: authSession, purpose: sealPurpose))
    }
}

/// The stable catalog of in-app sign-in failures (the `failure` member of an answer): what an
/// app's screens rely on. A code is never renamed nor given another meaning.
public enum InAppFailure: String, Sendable, CaseIterable {
    case incorrectPassword = "incorrect_password"
    case invalidUnblockCode = "invalid_unblock_code"
    case invalidTOTPCode = "invalid_totp_code"
    case invalidEmailCode = "invalid_email_code"
    case invalidEmailAddress = "invalid_email_address"
    case tooManyRequests = "too_many_requests"
    case failedToSendEmail = "failed_to_send_email"
    case serverUnavailable = "server_unavailable"
    case requestTimeout = "request_timeout"
    case authenticationFailure = "authentication_failure"
    /// The upstream refused the account itself (blocked, locked, a leaked password, a policy):
    /// told only once the user has passed a second factor (the e-mailed code, the TOTP code);
    /// before that such a refusal is answered as `incorrect_password`.
    case accountRefused = "account_refused"

    /// The HTTP status of an answer carrying this failure.
    public var status: Int {
        switch self {
        case .incorrectPassword, .invalidUnblockCode, .invalidTOTPCode, .invalidEmailCode, .accountRefused: 403
        case .invalidEmailAddress: 400
        case .tooManyRequests: 429
        case .failedToSendEmail, .serverUnavailable: 503
        case .requestTimeout: 504
        case .authenticationFailure: 502
        }
    }
}
