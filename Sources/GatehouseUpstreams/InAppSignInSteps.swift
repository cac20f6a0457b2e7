public import GatehouseCore

// What a kind can do for an in-app sign-in (the authorization challenge endpoint): the steps its
// upstream really offers without a browser. A kind that offers none leaves `inAppSignIn` nil,
// and the server answers `redirect_to_web`: the app signs in in the browser.

/// The first step of an in-app sign-in at this upstream.
public enum InAppFirstStep: Sendable, Equatable {
    /// The account's password, relayed to the upstream (RFC 6749 §4.3).
    case password
    /// The upstream e-mails a link that hands the app a code.
    case emailLink
}

/// What the upstream made of one step.
public enum InAppOutcome: Sendable {
    /// Signed in: the grant, as a browser sign-in's `completeAuthorization` would give it.
    case signedIn(UpstreamGrant)
    /// The upstream asks for its second factor (a TOTP code); `token` continues its dialogue.
    case secondFactor(token: String)
    case refused(InAppRefusal)
}

/// Why a step did not go through.
public enum InAppRefusal: Error, Sendable, Equatable {
    /// The password, code or link code is wrong (the upstream's `invalid_grant`).
    case wrongInput
    /// The upstream asked to slow down (HTTP 429).
    case rateLimited(retryAfter: Int)
    /// The upstream cannot be reached, or answered 503.
    case unavailable
    /// The upstream did not answer in time.
    case timeout
    /// The upstream's answer cannot be used, or its dialogue is over (an expired second-factor
    /// token): the sign-in starts again. `detail` is for the log, never a secret.
    case unusable(String)
    /// The upstream refused the account itself, in a way that may follow a right password (a
    /// blocked user, a password found in a breach, a rule or Action denying access, the account
    /// locked after failed attempts): told to whoever holds the account's second factor only.
    case accountRefused(AccountRefusal)

    /// The refusal an `OAuthError` of a transport or an answer stands for.
    public init(_ error: OAuthError) {
        switch error.status {
        case 504: self = .timeout
        case 503: self = .unavailable
        case 429: self = .rateLimited(retryAfter: error.retryAfter ?? 5)
        default: self = error.code == "invalid_grant" ? .wrongInput : .unusable(error.detail)
        }
    }
}

/// Why an upstream refused an account, as its user is told once a second factor is passed.
public enum AccountRefusal: String, Sendable, CaseIterable {
    /// An administrator blocked the user (Auth0: 401 `unauthorized` "user is blocked").
    case blocked
    /// The upstream locked the account after failed attempts (Auth0: `too_many_attempts`); it
    /// usually e-mails its user how to unlock it.
    case locked
    /// The password was found in a breach (Auth0: `password_leaked`): it must be changed.
    case passwordLeaked = "password_leaked"
    /// A rule, Action or policy of the upstream refused the sign-in (`access_denied`).
    case denied
}

/// The in-app steps a kind's upstream offers.
public protocol InAppSignInSteps: Sendable {
    var firstStep: InAppFirstStep { get }
    /// Relays `login` and `password` once to the upstream. `clientAddress`: the user's address
    /// (the peer, or what a trusted proxy says), for an upstream that protects accounts by it.
    func password(login: String, password: String, scopes: [String], clientAddress: String?) async -> InAppOutcome
    /// Answers the upstream's second factor with a TOTP code.
    func secondFactor(token: String, otp: String, clientAddress: String?) async -> InAppOutcome
    /// Asks the upstream to e-mail its sign-in link to `email`; `nil` once sent.
    func sendEmailLink(to email: String, clientAddress: String?) async -> InAppRefusal?
    /// The code the e-mailed link handed to the app, for the dialogue of `email`: a code of
    /// another address is a wrong code.
    func emailCode(_ code: String, for email: String) async -> InAppOutcome
}

extension InAppSignInSteps {
    public func password(login: String, password: String, scopes: [String], clientAddress: String?) async -> InAppOutcome {
        .refused(.unusable("this upstream takes no password"))
    }
    public func secondFactor(token: String, otp: String, clientAddress: String?) async -> InAppOutcome {
        .refused(.unusable("this upstream has no second factor"))
    }
    public func sendEmailLink(to email: String, clientAddress: String?) async -> InAppRefusal? {
        .unusable("this upstream sends no sign-in link")
    }
    public func emailCode(_ code: String, for email: String) async -> InAppOutcome {
        .refused(.unusable("this upstream sends no sign-in link"))
    }
}
