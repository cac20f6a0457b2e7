/// Whether an app's tokens are bound to a key the app holds (RFC 9449, `clients[].dpop`).
public enum DPoPPolicy: String, Sendable, CaseIterable {
    /// Every token request carries a DPoP proof; tokens without one are refused.
    case required
    /// A token request with a proof gets bound tokens; one without gets bearer tokens (the default).
    case optional
    /// Proofs are ignored: the app always gets bearer tokens.
    case off
}

/// How much an app's instances must prove they are the genuine app (`clients[].instances.attestation`).
public enum AttestationPolicy: String, Sendable, CaseIterable {
    /// Only certified instances get tokens (attested, or certified by e-mailed code when allowed).
    case required
    /// Instances may certify themselves; uncertified ones get tokens too.
    case preferred
    /// No attestation endpoint for this app's instances.
    case off
}

/// Each install of an app registers itself as its own OAuth client (`clients[].instances`).
public struct InstanceSettings: Sendable {
    /// An instance that has not signed in or refreshed for this long expires.
    public var unusedLifetime: Duration
    public var attestation: AttestationPolicy
    /// How long a registered instance lives before its first sign-in: a registration that leads
    /// nowhere is gone in minutes, not after `unused_lifetime`.
    public var pendingLifetime: Duration = .seconds(15 * 60)
    /// Instances of the app that registered and have not signed in yet, at most: past it,
    /// registration answers 429 until some sign in or expire.
    public var maximumPending: Int = 10_000
    /// With `attestation: required`: an uncertified instance's sign-in pauses for a code e-mailed to the user.
    public var manualCertification: Bool
    public var apple: AppleAttestationSettings?
    public var play: PlayIntegritySettings?

    public init(unusedLifetime: Duration = .seconds(90 * 86400), attestation: AttestationPolicy = .off, manualCertification: Bool = false,
                apple: AppleAttestationSettings? = nil, play: PlayIntegritySettings? = nil) {
        self.unusedLifetime = unusedLifetime
        self.attestation = attestation
        self.manualCertification = manualCertification
        self.apple = apple
        self.play = play
    }
}

/// Apple App Attest for an app (`instances.apple`).
public struct AppleAttestationSettings: Sendable {
    /// The App ID: team id, a dot, bundle id (its SHA-256 is the attestation's RP id hash).
    public var appID: String
    /// `development` keys come from the App Attest sandbox (aaguid `appattestdevelop`).
    public var development: Bool
    /// `root_ca_file`'s content; `nil`: the Apple App Attestation Root CA Gatehouse ships.
    public var rootCertificatesPEM: String?

    public init(appID: String, development: Bool = false, rootCertificatesPEM: String? = nil) {
        self.appID = appID
        self.development = development
        self.rootCertificatesPEM = rootCertificatesPEM
    }
}

/// Google Play Integrity verdicts, decrypted and verified locally (`instances.play`).
public struct PlayIntegritySettings: Sendable {
    public var packageName: String
    /// Base64 of the 32-byte AES key the Play Console gives (`decryption_key_file`).
    public var decryptionKey: Secret
    /// Base64 of the DER P-256 public key the Play Console gives (`verification_key_file`).
    public var verificationKey: Secret
    /// The `deviceRecognitionVerdict` level an instance's device must reach.
    public var requiredDeviceVerdict: String
    /// How old a verdict (`timestampMillis`) may be.
    public var maximumAge: Duration

    public init(packageName: String, decryptionKey: Secret, verificationKey: Secret,
                requiredDeviceVerdict: String = "MEETS_DEVICE_INTEGRITY", maximumAge: Duration = .seconds(300)) {
        self.packageName = packageName
        self.decryptionKey = decryptionKey
        self.verificationKey = verificationKey
        self.requiredDeviceVerdict = requiredDeviceVerdict
        self.maximumAge = maximumAge
    }
}

/// The SMTP relay manual certification codes go through (`mail:`).
public struct MailSettings: Sendable {
    public var host: String
    public var port: Int
    /// STARTTLS before anything is sent (RFC 3207); only a loopback relay may go without.
    public var startTLS: Bool
    /// `ca_file`'s content: the certificates the relay is checked against instead of the system's roots.
    public var trustRootsPEM: String?
    /// AUTH PLAIN, after STARTTLS, when set.
    public var username: String?
    public var password: Secret?
    /// The sender's address (an RFC 5321 addr-spec).
    public var from: String
    /// Deadline of one whole delivery.
    public var timeout: Duration

    public init(host: String, port: Int = 587, startTLS: Bool = true, trustRootsPEM: String? = nil, username: String? = nil,
                password: Secret? = nil, from: String, timeout: Duration = .seconds(10)) {
        self.host = host
        self.port = port
        self.startTLS = startTLS
        self.trustRootsPEM = trustRootsPEM
        self.username = username
        self.password = password
        self.from = from
        self.timeout = timeout
    }
}

/// Web sessions opened in an app's webviews with a one-time session code (`webviews:`).
public struct WebviewSettings: Sendable {
    /// Origins (`scheme://host[:port]`) `/session` may send the webview back to, and whose
    /// `Origin` a cookie-authenticated non-GET request may carry.
    public var origins: [String]
    /// Lifetime of the session cookie (never beyond the session's own).
    public var cookieLifetime: Duration

    public init(origins: [String], cookieLifetime: Duration = .seconds(3600)) {
        self.origins = origins
        self.cookieLifetime = cookieLifetime
    }
}

/// Checks of DPoP proofs (`dpop:`).
public struct DPoPSettings: Sendable {
    /// How a proof's `jti` is kept from being accepted twice (`dpop.replay_protection`).
    public enum ReplayProtection: String, Sendable, CaseIterable {
        /// Every proof id is written to the store, and found new there, before the request goes
        /// on: the guarantee holds on any deployment, whatever routes requests to which instance.
        case store
        /// Every proof carries a nonce this very process gave out (its key is made at start) in
        /// a live epoch: its memory of the proof ids of those epochs is complete, and no store
        /// write is needed. A request must reach the instance whose nonce it carries.
        case instanceNonce = "instance_nonce"
    }

    /// Every proof must carry a fresh server nonce (`DPoP-Nonce`, RFC 9449 §8 and §9).
    public var requireNonce: Bool
    /// How far a proof's `iat` may be from now, either way.
    public var proofLifetime: Duration
    /// Proof ids (`jti`) remembered in memory per instance (the store remembers them across instances).
    public var replayCacheEntries: Int
    public var replayProtection: ReplayProtection
    /// `instance_nonce`: how long one nonce epoch lasts; a nonce is accepted in its epoch and the next.
    public var nonceEpoch: Duration

    public init(requireNonce: Bool = false, proofLifetime: Duration = .seconds(60), replayCacheEntries: Int = 100_000,
                replayProtection: ReplayProtection = .store, nonceEpoch: Duration = .seconds(15)) {
        self.requireNonce = requireNonce
        self.proofLifetime = proofLifetime
        self.replayCacheEntries = replayCacheEntries
        self.replayProtection = replayProtection
        self.nonceEpoch = nonceEpoch
    }

    /// Whether every proof needs a server nonce: `dpop.nonce`, or instance-bound nonces.
    public var noncesRequired: Bool { requireNonce || replayProtection == .instanceNonce }
}

/// The client ids of registered instances: `<app client_id>~<random>`. A configured client id
/// never holds `~`, so an instance id names its app without asking the store.
public enum InstanceID {
    public static let separator: Character = "~"

    /// A new instance id of `app`.
    public static func make(app: String) -> String { app + String(separator) + SecureToken.generate() }

    /// The app and the random part of an instance id; `nil` for anything else.
    public static func split(_ id: String) -> (app: String, random: String)? {
        guard let index = id.lastIndex(of: separator) else { return nil }
        let app = String(id[..<index]), random = String(id[id.index(after: index)...])
        guard !app.isEmpty, random.count >= 32, random.utf8.allSatisfy(isBase64URL) else { return nil }
        return (app, random)
    }

    /// An instance id as logs and the audit stream show it: its app and the first characters of the
    /// hash of its random part; `?` for anything that is not an instance id.
    public static func label(_ id: String) -> String {
        guard let (app, random) = split(id) else { return "?" }
        return app + String(separator) + SecureToken.hash(random).prefix(8)
    }

    private static func isBase64URL(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "0")...UInt8(ascii: "9"),
             UInt8(ascii: "-"), UInt8(ascii: "_"): true
        default: false
        }
    }
}

extension GatehouseConfiguration {
    /// The app client `clientID` names: a configured one, or for a registered instance's id its
    /// app, under the instance's id. Whether the instance exists (and is live) is the store's to say.
    public func appClient(for clientID: String) -> AppClient? {
        if let client = clients[clientID] { return client }
        guard let (app, _) = InstanceID.split(clientID), var client = clients[app], client.instances != nil else { return nil }
        client.clientID = clientID
        return client
    }
}
