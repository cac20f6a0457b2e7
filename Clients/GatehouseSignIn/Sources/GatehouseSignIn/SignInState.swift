public import Foundation

/// The states of the in-app sign-in, named as in Mozilla VPN's in-app authentication (the seed):
/// the ones waiting for the user (`start`, `signIn`, `unblockCodeNeeded`, `totpVerificationNeeded`,
/// `emailVerification`), the transient ones while a request is under way (`checkingAccount`,
/// `signingIn`, `verifying…`), and the two ends (`finalize`, `fallbackInBrowser`).
public enum SignInState: Sendable, Equatable {
    /// Nothing read yet: call `start()`.
    case initializing
    /// Ask for the e-mail address (or the upstream's username): call `checkAccount(_:)`.
    case start
    case checkingAccount
    /// Ask for the password: `setPassword(_:)`, then `signIn()`.
    case signIn
    case signingIn
    /// An e-mailed 6-digit code is needed with the password: `verifyUnblockCode(_:)` or `resendUnblockCodeEmail()`.
    case unblockCodeNeeded
    case verifyingUnblockCode
    /// The account's TOTP code: `verifySessionTotpCode(_:)`.
    case totpVerificationNeeded
    case verifyingSessionTotpCode
    /// The code an e-mailed link handed to the app: `verifySessionEmailCode(_:)` or `resendVerificationSessionCodeEmail()`.
    case emailVerification
    case verifyingSessionEmailCode
    /// Signed in.
    case finalize(Tokens)
    /// Continue in the browser (RFC 8252) at this URL; `InAppSignIn.browserSignIn` has what the redemption needs.
    case fallbackInBrowser(URL)

    /// The case's name, as spelled above (`"checkingAccount"`, `"finalize"`…).
    public var name: String {
        switch self {
        case .initializing: "initializing"
        case .start: "start"
        case .checkingAccount: "checkingAccount"
        case .signIn: "signIn"
        case .signingIn: "signingIn"
        case .unblockCodeNeeded: "unblockCodeNeeded"
        case .verifyingUnblockCode: "verifyingUnblockCode"
        case .totpVerificationNeeded: "totpVerificationNeeded"
        case .verifyingSessionTotpCode: "verifyingSessionTotpCode"
        case .emailVerification: "emailVerification"
        case .verifyingSessionEmailCode: "verifyingSessionEmailCode"
        case .finalize: "finalize"
        case .fallbackInBrowser: "fallbackInBrowser"
        }
    }

    /// True while a request is under way (no method may be called).
    public var isTransient: Bool {
        switch self {
        case .checkingAccount, .signingIn, .verifyingUnblockCode, .verifyingSessionTotpCode, .verifyingSessionEmailCode: true
        default: false
        }
    }

    /// True for `finalize` and `fallbackInBrowser`: the dialogue is over.
    public var isFinal: Bool {
        switch self {
        case .finalize, .fallbackInBrowser: true
        default: false
        }
    }

    /// The waiting state of a challenge `step` (`password`, `unblock_code`, `otp`, `email_link`).
    static func waiting(forStep step: String) -> SignInState? {
        switch step {
        case "password": .signIn
        case "unblock_code": .unblockCodeNeeded
        case "otp": .totpVerificationNeeded
        case "email_link": .emailVerification
        default: nil
        }
    }
}

extension SignInState: CustomStringConvertible {
    /// The name, and the URL of a fallback; never a token.
    public var description: String {
        if case .fallbackInBrowser(let url) = self { return "fallbackInBrowser(\(url.absoluteString))" }
        return name
    }
}

/// What the app needs to finish a `fallbackInBrowser` sign-in: open `url`, then redeem the code
/// the redirect brings at the token endpoint with `codeVerifier` (and `redirectURI`), after
/// checking that the redirect's `state` is `state`.
public struct BrowserSignIn: Sendable, Equatable {
    public let url: URL
    public let codeVerifier: String
    /// The `state` parameter the redirect must bring back (nil when none was sent).
    public let state: String?
    public let redirectURI: URL?
    public let tokenEndpoint: URL?
}

extension BrowserSignIn: CustomStringConvertible {
    public var description: String { "BrowserSignIn(url: \(url.absoluteString), codeVerifier: <redacted>)" }
}
