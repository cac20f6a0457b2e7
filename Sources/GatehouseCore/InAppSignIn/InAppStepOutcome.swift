// What an upstream makes of one in-app step, as the dialogue's rules see it: pure values, so
// that `ChallengeDialogueMachine` decides on them without knowing the upstream kinds.
// `GatehouseUpstreams` names the outcome with its own grant: `InAppOutcome`.

/// The first step of an in-app sign-in at this upstream.
public enum InAppFirstStep: Sendable, Equatable {
    /// The account's password, relayed to the upstream (RFC 6749 §4.3).
    case password
    /// The upstream e-mails a link that hands the app a code.
    case emailLink
}

/// What the upstream made of one step; `Grant` is what a sign-in gives (`UpstreamGrant`).
public enum InAppStepOutcome<Grant: Sendable>: Sendable {
    /// Signed in: the grant, as a browser sign-in's `completeAuthorization` would give it.
    case signedIn(Grant)
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

    /// Whether the upstream refused without judging the input (unreachable, slow, asking to
    /// wait): the step may be tried again, and the attempt counted for it is given back.
    public var isUnjudged: Bool {
        switch self {
        case .unavailable, .timeout, .rateLimited: true
        case .wrongInput, .unusable, .accountRefused: false
        }
    }

    /// The catalog's failure for this refusal, and the wait to answer with.
    public var failure: (InAppFailure, retryAfter: Int?) {
        switch self {
        case .rateLimited(let seconds): (.tooManyRequests, seconds)
        case .unavailable: (.serverUnavailable, nil)
        case .timeout: (.requestTimeout, nil)
        case .wrongInput, .unusable, .accountRefused: (.authenticationFailure, nil)
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
