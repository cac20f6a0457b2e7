public import GatehouseCore

// What a kind can do for an in-app sign-in (the authorization challenge endpoint): the steps its
// upstream really offers without a browser. A kind that offers none leaves `inAppSignIn` nil,
// and the server answers `redirect_to_web`: the app signs in in the browser. The values the
// steps answer with (`InAppFirstStep`, `InAppRefusal`, `AccountRefusal`) live in Core, where
// the dialogue's rules decide on them (`ChallengeDialogueMachine`).

/// What the upstream made of one step: a sign-in gives an `UpstreamGrant`.
public typealias InAppOutcome = InAppStepOutcome<UpstreamGrant>

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
