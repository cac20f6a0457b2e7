// The machine's phases, and what each holds until the input it waits for: the request being
// answered, the bookkeeping still to do, the answer waiting for its `auth_session`.

extension ChallengeDialogueMachine {
    public enum State: Sendable {
        /// Waiting for `begin` or `request`.
        case ready
        case takingAccountToken(then: AfterToken)
        /// The password step: counting the password, then the reasons it may wait for a code.
        case countingPasswords(password: String)
        case checkingCertification(password: String)
        case checkingBreaker(password: String)
        case admittingAccount(password: String)
        case relayingPassword(counted: Bool, tried: Tried)
        /// Counting the account's e-mails of the hour before one goes.
        case countingEmails(for: Mail)
        case mailingUnblockCode
        case sendingLink(first: Bool)
        case countingCodes(token: String, otp: String)
        case answeringSecondFactor
        case redeemingLinkCode
        /// Bookkeeping before `then` is settled: `chore` is under way.
        case tidying(Chore, rest: [Chore], then: Settlement)
        case issuingCode
        case saving(Saved)
        /// The answer is given: every input is out of order.
        case answered
    }

    /// What follows the account's token.
    public enum AfterToken: Sendable, Equatable {
        /// A new e-mailed-link dialogue: its first link.
        case firstLink
        /// A later request's step.
        case step(Request)
    }

    /// What an e-mail being counted is for.
    public enum Mail: Sendable, Equatable {
        case firstLink
        case link
        case unblockCode(because: Hold?)
    }

    /// The scopes that count the account among those they tried, and those that counted it for
    /// this request (none after an unblock code).
    public struct Tried: Sendable {
        public var all: [Scope]
        public var counted: [Scope]

        public static var none: Tried { Tried(all: [], counted: []) }
    }

    /// Bookkeeping around an upstream's answer, done in order before the answer is settled.
    public enum Chore: Sendable {
        case giveAttemptBack(Counter)
        case giveAccountBack([Scope])
        /// The password relayed with an unblock code, counted once found wrong: the store must
        /// count it (a failure answers `storeUnavailable`).
        case countPassword
        case recordFailure(FailureReason)
        case resetCounters([Counter])

        var effect: Effect {
            switch self {
            case .giveAttemptBack(let counter): .giveAttemptBack(counter)
            case .giveAccountBack(let scopes): .giveAccountBack(scopes)
            case .countPassword: .countAttempt(.passwords)
            case .recordFailure(let reason): .recordFailure(reason)
            case .resetCounters(let counters): .resetCounters(counters)
            }
        }
    }

    /// What follows the chores.
    public enum Settlement: Sendable {
        /// The upstream's answer to a step; `wrong` is the failure of a wrong input.
        case outcome(InAppStepOutcome<Grant>, wrong: InAppFailure)
        case issue(Grant)
        case askSecondFactor(token: String)
        case hold(Hold)
    }

    /// The answer given once the dialogue is saved under its fresh `auth_session`.
    public enum Saved: Sendable, Equatable {
        case next(ChallengeStep, failure: InAppFailure?)
        case failed(InAppFailure, retryAfter: Int?)
        case wrongShape(detail: String)

        func reply(_ session: String) -> Reply {
            switch self {
            case .next(let step, let failure): .next(step, session: session, failure: failure)
            case .failed(let failure, let retryAfter): .failed(failure, session: session, retryAfter: retryAfter)
            case .wrongShape(let detail): .wrongShape(detail: detail, session: session)
            }
        }
    }
}
