/// `clients[].in_app_sign_in`: whether the app may sign its user in without a browser, at the
/// authorization challenge endpoint (draft-ietf-oauth-first-party-apps).
public enum InAppSignInPolicy: String, Sendable, CaseIterable {
    case off
    case on
}

/// The `in_app_sign_in:` section: the dialogue's lifetimes and its step-up.
public struct InAppSignInSettings: Sendable, Equatable {
    /// How long an `auth_session` lives after its last answer.
    public var sessionLifetime: Duration = .seconds(600)
    /// Wrong inputs (passwords, codes) within one dialogue before it ends; also the second-factor
    /// codes one account may send within `failureWindow`.
    public var attempts: Int = 5
    /// Passwords one account may have relayed without a success within `failureWindow`; past them
    /// an unblock code is e-mailed first.
    public var unblockAfter: Int = 3
    public var failureWindow: Duration = .seconds(900)
    /// How long an e-mailed unblock code is valid.
    public var codeLifetime: Duration = .seconds(600)
    /// E-mails (unblock codes, magic links) one dialogue may send beyond the first.
    public var resends: Int = 3
    /// E-mails one account may get in an hour, whatever the dialogues (counted in the store).
    public var emailsPerHour: Int = 5
    /// Accounts whose passwords one client address range (an IPv6 address by its /64) may have
    /// relayed within `accountsWindow`, on every instance (counted in the store); an account whose
    /// password was right is given back. Past it, passwords for other accounts are refused (429).
    public var accountsPerAddress: Int = 10
    /// The same per app instance (an install with its own client id).
    public var accountsPerInstance: Int = 3
    public var accountsWindow: Duration = .seconds(3600)
    /// Wrong passwords of one upstream's accounts, all dialogues and instances together, within
    /// `breakerWindow` before the breaker trips: until the window ends, every dialogue passes an
    /// e-mailed code before its password is relayed (`redirect_to_web` for a login that is no
    /// address). nil: no breaker.
    public var breakerFailures: Int? = 100
    public var breakerWindow: Duration = .seconds(300)

    public init() {}
}

extension GatehouseConfiguration {
    static func decodeInAppSignIn(_ map: MappingReader) -> InAppSignInSettings {
        var settings = InAppSignInSettings()
        settings.sessionLifetime = map.duration("session_lifetime", in: .seconds(60)...(.seconds(3600))) ?? settings.sessionLifetime
        settings.attempts = map.integer("attempts", in: 1...20) ?? settings.attempts
        settings.unblockAfter = map.integer("unblock_after", in: 1...100) ?? settings.unblockAfter
        settings.failureWindow = map.duration("failure_window", in: .seconds(60)...(.seconds(86400))) ?? settings.failureWindow
        settings.codeLifetime = map.duration("code_lifetime", in: .seconds(60)...(.seconds(3600))) ?? settings.codeLifetime
        settings.resends = map.integer("resends", in: 0...20) ?? settings.resends
        settings.emailsPerHour = map.integer("emails_per_hour", in: 1...100) ?? settings.emailsPerHour
        settings.accountsPerAddress = map.integer("accounts_per_address", in: 1...10_000) ?? settings.accountsPerAddress
        settings.accountsPerInstance = map.integer("accounts_per_instance", in: 1...1000) ?? settings.accountsPerInstance
        settings.accountsWindow = map.duration("accounts_window", in: .seconds(60)...(.seconds(86400))) ?? settings.accountsWindow
        if case .scalar("off", _)? = map.value("breaker_failures") {
            settings.breakerFailures = nil
        } else {
            settings.breakerFailures = map.integer("breaker_failures", in: 1...1_000_000) ?? settings.breakerFailures
        }
        settings.breakerWindow = map.duration("breaker_window", in: .seconds(60)...(.seconds(3600))) ?? settings.breakerWindow
        map.finish()
        return settings
    }
}
