import Foundation
import GatehouseCore
import Logging

// Password spraying: one common password tried against many accounts stays under every
// per-account limit. Two store-backed limits (so that they hold on every instance and across
// restarts) count the distinct accounts each client address range and each app instance has had
// passwords relayed for, and a breaker on the upstream's overall rate of wrong passwords asks
// every dialogue for the e-mailed code while it is tripped.

extension InAppSignIn {
    /// Who tried an account: a client address range (an IPv6 address by its /64) or an app instance.
    struct AccountScope: Sendable {
        let limit: GatehouseMetrics.Limit
        /// The store key of the scope's count of accounts.
        let key: String
        /// The store key of the pair (scope, account): counted once per window.
        let pairKey: String
    }

    enum AccountAdmission {
        /// Every scope the account counts in (counted now or before, within the window), and
        /// those this request counted it in.
        case admitted(all: [AccountScope], counted: [AccountScope])
        /// The scope is past its limit: the password waits for the e-mailed code, and the
        /// scopes this request counted the account in are to be given back.
        case refused(AccountScope, counted: [AccountScope])
    }

    static let accountsPurpose = "in-app-accounts"
    static let accountPairPurpose = "in-app-account-pair"
    static let breakerPurpose = "in-app-breaker"

    /// Counts the dialogue's account among those its client's address range and its app instance
    /// have tried within `accounts_window`, before its password is relayed: racing dialogues on
    /// any instance relay passwords for at most `accounts_per_address` (`accounts_per_instance`)
    /// accounts. An account already counted in the window is not counted again. What a refusal
    /// counted, and the account after a right password, are given back (`giveBack`).
    ///
    /// Windows are aligned (the `accounts_window` of the Unix epoch the request falls in), and the
    /// window is part of both keys, so that a pair and its scope's count always end together.
    func admitAccount(_ dialogue: ChallengeDialogue, client: AppClient, address: String?) async throws -> AccountAdmission {
        let account = accountKey(dialogue)
        let length = max(1, Int(settings.accountsWindow.inSeconds))
        let window = Int(now().timeIntervalSince1970) / length
        let end = Date(timeIntervalSince1970: TimeInterval((window + 1) * length))
        var scopes: [(AccountScope, Int)] = []
        if let address {
            scopes.append((scope(.in_app_accounts_per_address, "address\n\(window)\n" + dialogue.upstream + "\n" + address, account: account),
                           settings.accountsPerAddress))
        }
        if client.isInstance {
            scopes.append((scope(.in_app_accounts_per_instance, "instance\n\(window)\n" + client.clientID, account: account),
                           settings.accountsPerInstance))
        }
        var counted: [AccountScope] = []
        for (scope, limit) in scopes {
            let seen = try await countStore(Self.accountPairPurpose, scope.pairKey, until: end)
            guard seen == 1 else { continue }
            let tried = try await countStore(Self.accountsPurpose, scope.key, until: end)
            counted.append(scope)
            if tried > limit {
                limits.refused(scope.limit, clientID: dialogue.clientID, subject: nil)
                return .refused(scope, counted: counted)
            }
        }
        return .admitted(all: scopes.map(\.0), counted: counted)
    }

    /// Gives the account back to the scopes that count it: its password was right, or it was not
    /// relayed. The pair is taken out in one statement (`consumeOnce`), so two requests giving the
    /// same account back at once give it back once. Every scope is tried; the first failure is thrown.
    func giveBack(_ scopes: [AccountScope]) async throws {
        var failure: (any Error)?
        for scope in scopes {
            do {
                guard try await store.consumeOnce(kind: AttemptCounter.kind(Self.accountPairPurpose), keyHash: scope.pairKey, now: now()) != nil
                else { continue }
                try await store.discountAttempt(purpose: Self.accountsPurpose, keyHash: scope.key, now: now())
            } catch {
                failure = failure ?? error
            }
        }
        if let failure { throw failure }
    }

    /// Whether the upstream's wrong passwords within `breaker_window`, on every instance, are past
    /// `breaker_failures`: then every dialogue passes an e-mailed code before its password is
    /// relayed, until the window ends with fewer. Counted and audited per dialogue it stops.
    func breakerTripped(_ dialogue: ChallengeDialogue) async throws -> Bool {
        guard let threshold = settings.breakerFailures else { return false }
        let failures = try await store.attemptCount(purpose: Self.breakerPurpose, keyHash: breakerKey(dialogue), now: now())
        guard failures >= threshold else { return false }
        limits.refused(.in_app_breaker, clientID: dialogue.clientID, subject: nil)
        return true
    }

    /// One wrong password (or a refusal told as one): audited, and counted toward the breaker,
    /// whose tripping is audited once per window (the count that crosses the line is seen by one
    /// request only, whichever instance). A store that cannot count throws, after the audit.
    func countFailure(_ dialogue: ChallengeDialogue, reason: String) async throws {
        audit.record(.sign_in_failed, clientID: dialogue.clientID, subject: nil, reason: reason,
                     metadata: ["upstream": .string(dialogue.upstream)])
        guard let threshold = settings.breakerFailures else { return }
        let failures = try await store.countAttempt(purpose: Self.breakerPurpose, keyHash: breakerKey(dialogue),
                                                    expiresAt: expiry(after: settings.breakerWindow), now: now())
        if failures == threshold {
            logger.warning("in-app sign-in breaker tripped: every dialogue passes an e-mailed code before a password is relayed", metadata: [
                "upstream": .string(dialogue.upstream), "failures": .stringConvertible(failures),
                "window_seconds": .stringConvertible(Int(settings.breakerWindow.inSeconds)),
            ])
            audit.record(.sign_in_breaker_tripped, clientID: nil, subject: nil, reason: "failed_passwords",
                         metadata: ["upstream": .string(dialogue.upstream)])
        }
    }

    private func breakerKey(_ dialogue: ChallengeDialogue) -> String { SecureToken.hash("breaker\n" + dialogue.upstream) }

    private func scope(_ limit: GatehouseMetrics.Limit, _ who: String, account: String) -> AccountScope {
        let key = SecureToken.hash(who)
        return AccountScope(limit: limit, key: key, pairKey: SecureToken.hash(key + "\n" + account))
    }

    private func countStore(_ purpose: String, _ key: String, until end: Date) async throws -> Int {
        try await store.countAttempt(purpose: purpose, keyHash: key, expiresAt: end, now: now())
    }
}
