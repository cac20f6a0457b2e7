public import Foundation

/// The in-app sign-in's dialogue (`/oauth/authorize-challenge`) as a pure value: in each phase,
/// an input (the request's step, or the result of an effect) gives the next phase and the one
/// effect to carry out. `InAppSignIn` carries out effects (the store, the mail relay, the
/// upstream, the in-memory limits) and feeds their results back, until the machine answers.
/// Nothing here reads a clock, the store or the network; every rule of what the user is told
/// lives here, tested phase by input in `ChallengeDialogueMachineTests`.
///
/// `Grant` is what a sign-in gives (`UpstreamGrant`), `Scope` who counted the account among
/// those it tried (`InAppSignIn.AccountScope`): both only held and handed back.
///
/// A store that fails is an input too (`storeFailed`): where the count it could not make
/// decides what is relayed, the answer is `storeUnavailable`; where it was bookkeeping (giving
/// an attempt back, resetting counters after a success, the breaker's count), the dialogue goes
/// on and the route logs it.
///
/// **A new step** (say, an SMS code) is: a `ChallengeStep` case (its field, in
/// `ChallengeDialogue.swift`); in this machine, one case in `dispatch` (and, when it waits for
/// something new, one `State` and one `Input`, with their `receive` cases); one row per new
/// input or phase in the table of `ChallengeDialogueMachineTests`; its failure in the catalog
/// (`InAppFailure`, the README and `openapi/`); and the client's screen for it (`GatehouseSignIn`).
public struct ChallengeDialogueMachine<Grant: Sendable, Scope: Sendable>: Sendable {
    /// The store counters of an account.
    public enum Counter: Sendable, Equatable, CaseIterable {
        /// Passwords relayed between two successes (the unblock code's line, `unblock_after`).
        case passwords
        /// Second-factor codes relayed (`attempts` per window, whatever the dialogues).
        case secondFactorCodes
        /// E-mails sent this hour (`emails_per_hour`).
        case emails
    }

    /// Why a password waits for the e-mailed unblock code.
    public enum Hold: Sendable, Equatable {
        /// The account has failed `unblock_after` times in the window.
        case account
        /// The client is an install no platform or code has certified.
        case uncertified
        /// The upstream's wrong-password breaker is tripped.
        case breaker
        /// The client's address range or app instance has tried too many accounts.
        case accounts(GatehouseMetrics.Limit)

        public var reason: String {
            switch self {
            case .account: "account"
            case .uncertified: "uncertified"
            case .breaker: "breaker"
            case .accounts(let limit): limit.rawValue
            }
        }
    }

    /// Why a wrong password is recorded (audited, and counted toward the breaker).
    public enum FailureReason: Sendable, Equatable {
        case incorrectPassword
        /// The upstream refused the account before a second factor: answered as a wrong password.
        case accountRefused(AccountRefusal)

        public var reason: String {
            switch self {
            case .incorrectPassword: InAppFailure.incorrectPassword.rawValue
            case .accountRefused(let refusal): "account_refused_" + refusal.rawValue
            }
        }
    }

    /// What a later request brings: its step inputs (`ChallengeStep.inputFields` present in the
    /// form; others are ignored), its `resend`, and when it arrived.
    public struct Request: Sendable, Equatable {
        public var fields: [String: String]
        public var resend: String?
        public var now: Date

        public init(fields: [String: String], resend: String? = nil, now: Date) {
            self.fields = fields.filter { ChallengeStep.inputFields.contains($0.key) }
            self.resend = resend
            self.now = now
        }
    }

    public enum Input: Sendable {
        /// A new dialogue, at the upstream's first step.
        case begin(InAppFirstStep)
        /// A later request, its dialogue unsealed and its client checked.
        case request(Request)
        /// `takeAccountToken`: the wait when the account's bucket is empty.
        case accountToken(retryAfter: Int?)
        /// `countAttempt`: the count with this attempt.
        case counted(Int)
        /// `checkCertification`.
        case certification(uncertified: Bool)
        /// `checkBreaker`.
        case breaker(tripped: Bool)
        /// `admitAccount`: every scope that counts the account, and those this request counted it in.
        case accountAdmitted(all: [Scope], counted: [Scope])
        /// `admitAccount`: a scope is past its limit; `counted` are to be given back.
        case accountHeld(GatehouseMetrics.Limit, counted: [Scope])
        /// `relayPassword`, `answerSecondFactor`, `redeemEmailCode`.
        case upstream(InAppStepOutcome<Grant>)
        /// `sendEmailLink`.
        case linkSent
        case linkRefused(InAppRefusal)
        /// `emailUnblockCode`: the code's SHA-256 and the end of its validity.
        case unblockCodeMailed(codeHash: String, expiresAt: Date)
        case mailFailed
        /// A bookkeeping effect is done.
        case done
        /// `issueCode`.
        case codeIssued(String)
        /// `save`: the fresh `auth_session`.
        case saved(session: String)
        /// The store failed the effect.
        case storeFailed
    }

    public enum Effect: Sendable {
        /// Take a token of the account's bucket (in memory); report `accountToken`.
        case takeAccountToken
        /// Count one attempt for the account in the store; report `counted`.
        case countAttempt(Counter)
        /// Whether the client is an uncertified install; report `certification`.
        case checkCertification
        /// Whether the wrong-password breaker is tripped; report `breaker`.
        case checkBreaker
        /// Count the account among those the client's address range and instance tried; report
        /// `accountAdmitted` or `accountHeld`.
        case admitAccount
        /// Relay the dialogue's account and this password to the upstream; report `upstream`.
        case relayPassword(String)
        /// Answer the upstream's second factor; report `upstream`.
        case answerSecondFactor(token: String, otp: String)
        /// Hand the upstream the code its e-mailed link gave the app; report `upstream`.
        case redeemEmailCode(String)
        /// Ask the upstream to e-mail its link to the account; report `linkSent` or `linkRefused`.
        case sendEmailLink
        /// E-mail a fresh unblock code to the account (`because`: for the log; `nil` on a resend);
        /// report `unblockCodeMailed` or `mailFailed`.
        case emailUnblockCode(because: Hold?)
        /// Give back an attempt counted for a step the upstream never judged; report `done`.
        case giveAttemptBack(Counter)
        /// Give the account back to the scopes that counted it; report `done`.
        case giveAccountBack([Scope])
        /// Audit a wrong password and count it toward the breaker; report `done`.
        case recordFailure(FailureReason)
        /// Reset the account's counters after a success; report `done`.
        case resetCounters([Counter])
        /// Issue the Gatehouse code for the grant; report `codeIssued`.
        case issueCode(Grant)
        /// Keep the dialogue under a fresh `auth_session`; report `saved`.
        case save(ChallengeDialogue)
        /// Answer the request: the machine is done.
        case answer(Reply)
    }

    /// What the user is told.
    public enum Reply: Sendable, Equatable {
        /// Done: the code for `/oauth/token`.
        case code(String)
        /// The next step, with the failure of the previous input when there was one.
        case next(ChallengeStep, session: String, failure: InAppFailure?)
        /// A catalog failure; the dialogue goes on when `session` is set.
        case failed(InAppFailure, session: String?, retryAfter: Int?)
        /// Too many requests for this dialogue: it is over (`too_many_requests`, `dialogue_ended`).
        case ended(Ending)
        /// Another step's input, or a resend of another step: `invalid_request`.
        case wrongShape(detail: String, session: String)
        /// The upstream refused the account past a second factor: the user is told why.
        case accountRefused(AccountRefusal)
        /// The upstream's answer cannot be used: `authentication_failure`, the dialogue is over.
        case upstreamUnusable(detail: String)
        /// No address to e-mail a code to: the browser.
        case redirectToWeb
        case invalidSession
        /// The store failed where it decides what happens: nothing more was done.
        case storeUnavailable
        /// The code could not be recorded.
        case codeNotRecorded
        /// An input the phase does not wait for (a fault of the route's): nothing more is done.
        case outOfOrder
    }

    public enum Ending: Sendable, Equatable {
        /// `in_app_sign_in.attempts` wrong inputs in this dialogue.
        case wrongInputs
        /// `attempts` second-factor codes for the account in the window, whatever the dialogues.
        case secondFactorCodes
    }

    /// The wait a per-dialogue limit answers with (too many wrong inputs, no more e-mails): a pause
    /// before the user starts again; the limits per account and address decide what comes after.
    public static var pause: Int { 30 }
    /// The wait answered when the account's e-mails for the hour are spent.
    public static var mailPause: Int { 600 }

    public let settings: InAppSignInSettings
    /// Whether a mail relay can send unblock codes.
    public let canMail: Bool
    /// The dialogue as it will be saved.
    public internal(set) var dialogue: ChallengeDialogue
    public internal(set) var state: State = .ready

    public init(dialogue: ChallengeDialogue, settings: InAppSignInSettings, canMail: Bool) {
        self.dialogue = dialogue
        self.settings = settings
        self.canMail = canMail
    }

    /// The effect of `input` in the current phase; `.answer(.outOfOrder)` for an input the
    /// phase does not wait for.
    public mutating func receive(_ input: Input) -> Effect {
        let state = self.state
        self.state = .answered
        switch (state, input) {
        case (.ready, .begin(let first)):
            return begin(first)
        case (.ready, .request(let request)):
            return check(request)
        case (.takingAccountToken(let then), .accountToken(let wait)):
            return tokenTaken(then, retryAfter: wait)

        case (.countingPasswords(let password), .counted(let count)):
            guard count <= settings.unblockAfter else { return hold(.account) }
            return wait(.checkingCertification(password: password), .checkCertification)
        case (.checkingCertification(let password), .certification(let uncertified)):
            return uncertified ? hold(.uncertified) : wait(.checkingBreaker(password: password), .checkBreaker)
        case (.checkingBreaker(let password), .breaker(let tripped)):
            return tripped ? hold(.breaker) : wait(.admittingAccount(password: password), .admitAccount)
        case (.admittingAccount(let password), .accountAdmitted(let all, let counted)):
            return wait(.relayingPassword(counted: true, tried: Tried(all: all, counted: counted)), .relayPassword(password))
        case (.admittingAccount, .accountHeld(let limit, let counted)):
            return tidy(counted.isEmpty ? [] : [.giveAccountBack(counted)], then: .hold(.accounts(limit)))
        case (.relayingPassword(let counted, let tried), .upstream(let outcome)):
            return relayed(outcome, counted: counted, tried: tried)

        case (.countingEmails(let mail), .counted(let count)):
            return emailsCounted(count, for: mail)
        case (.mailingUnblockCode, .unblockCodeMailed(let codeHash, let expiresAt)):
            dialogue.step = .unblockCode
            dialogue.unblockCodeHash = codeHash
            dialogue.unblockExpiresAt = expiresAt
            return save(.next(.unblockCode, failure: nil))
        case (.mailingUnblockCode, .mailFailed):
            return save(.failed(.failedToSendEmail, retryAfter: nil))
        case (.sendingLink, .linkSent):
            return save(.next(.emailLink, failure: nil))
        case (.sendingLink(let first), .linkRefused(let refusal)):
            // A new dialogue whose first link cannot go is not kept: the app starts again.
            let (failure, retryAfter) = refusal.failure
            return first ? answer(.failed(failure, session: nil, retryAfter: retryAfter)) : save(.failed(failure, retryAfter: retryAfter))

        case (.countingCodes(let token, let otp), .counted(let count)):
            guard count <= settings.attempts else { return answer(.ended(.secondFactorCodes)) }
            return wait(.answeringSecondFactor, .answerSecondFactor(token: token, otp: otp))
        case (.answeringSecondFactor, .upstream(let outcome)):
            return tidy(Self.unjudged(outcome) ? [.giveAttemptBack(.secondFactorCodes)] : [],
                        then: .outcome(outcome, wrong: .invalidTOTPCode))
        case (.redeemingLinkCode, .upstream(let outcome)):
            return settle(.outcome(outcome, wrong: .invalidEmailCode))

        case (.tidying(.countPassword, let rest, let then), .counted):
            return tidy(rest, then: then)
        case (.tidying(.countPassword, _, _), .storeFailed):
            return answer(.storeUnavailable)
        case (.tidying(let chore, let rest, let then), .done), (.tidying(let chore, let rest, let then), .storeFailed):
            // Bookkeeping: the route logs a store that failed it, and the dialogue goes on.
            if case .countPassword = chore { return answer(.outOfOrder) }
            return tidy(rest, then: then)

        case (.issuingCode, .codeIssued(let code)):
            return answer(.code(code))
        case (.issuingCode, .storeFailed):
            return answer(.codeNotRecorded)
        case (.saving(let saved), .saved(let session)):
            return answer(saved.reply(session))

        // A store that cannot count relays nothing, sends nothing and saves nothing.
        case (.countingPasswords, .storeFailed), (.checkingCertification, .storeFailed), (.checkingBreaker, .storeFailed),
             (.admittingAccount, .storeFailed), (.countingEmails, .storeFailed), (.countingCodes, .storeFailed), (.saving, .storeFailed):
            return answer(.storeUnavailable)

        default:
            return answer(.outOfOrder)
        }
    }

    // MARK: Moving on

    mutating func wait(_ state: State, _ effect: Effect) -> Effect {
        self.state = state
        return effect
    }

    mutating func answer(_ reply: Reply) -> Effect {
        state = .answered
        return .answer(reply)
    }

    /// Keeps the dialogue under a fresh `auth_session`, then answers `saved` with it.
    mutating func save(_ saved: Saved) -> Effect {
        wait(.saving(saved), .save(dialogue))
    }

    /// The chores in order, then the settlement.
    mutating func tidy(_ chores: [Chore], then settlement: Settlement) -> Effect {
        guard let chore = chores.first else { return settle(settlement) }
        return wait(.tidying(chore, rest: Array(chores.dropFirst()), then: settlement), chore.effect)
    }

    /// Whether the upstream refused a step without judging its input.
    public static func unjudged(_ outcome: InAppStepOutcome<Grant>) -> Bool {
        if case .refused(let refusal) = outcome { refusal.isUnjudged } else { false }
    }
}
