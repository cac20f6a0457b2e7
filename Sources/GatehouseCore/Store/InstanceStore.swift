public import Foundation

/// How a registered app instance proved it is the genuine app.
public enum InstanceCertification: String, Sendable, Codable, CaseIterable {
    /// Apple App Attest: an attestation, or an assertion by the key attested before.
    case apple
    /// A Google Play Integrity verdict.
    case play
    /// A 6-digit code e-mailed to the user during a sign-in, then "Allow this app".
    case manual
}

/// One install of an app, registered at `/oauth/register` (RFC 7591) under its own client id.
public struct InstanceRecord: Sendable, Equatable {
    /// The instance's client id (`<app client_id>~<random>`).
    public var id: String
    /// The app client it is an instance of (RFC 7591 `software_id`).
    public var softwareID: String
    /// The thumbprint of the DPoP key it registered with: every later request proves it holds that key.
    public var dpopJKT: String?
    public var certification: InstanceCertification?
    public var certifiedAt: Date?
    /// The App Attest key id (base64url), its public key (X9.63 P-256) and its last counter.
    public var appleKeyID: String?
    public var applePublicKey: Data?
    public var appleCounter: Int
    public var createdAt: Date
    public var lastUsedAt: Date
    /// `unused_lifetime` after its last sign-in or refresh.
    public var expiresAt: Date
    public var revokedAt: Date?
    /// The redirect URIs it registered, a subset of its app's; `nil`: all of the app's.
    public var redirectURIs: [String]?

    public init(id: String, softwareID: String, dpopJKT: String? = nil, certification: InstanceCertification? = nil,
                certifiedAt: Date? = nil, appleKeyID: String? = nil, applePublicKey: Data? = nil, appleCounter: Int = 0,
                createdAt: Date, lastUsedAt: Date? = nil, expiresAt: Date, revokedAt: Date? = nil, redirectURIs: [String]? = nil) {
        self.id = id
        self.softwareID = softwareID
        self.dpopJKT = dpopJKT
        self.certification = certification
        self.certifiedAt = certifiedAt
        self.appleKeyID = appleKeyID
        self.applePublicKey = applePublicKey
        self.appleCounter = appleCounter
        self.createdAt = createdAt
        self.lastUsedAt = lastUsedAt ?? createdAt
        self.expiresAt = expiresAt
        self.revokedAt = revokedAt
        self.redirectURIs = redirectURIs
    }

    /// `redirectURIs` as stored: a JSON array, or `nil`.
    public var redirectURIsJSON: String? {
        redirectURIs.flatMap { try? JSONEncoder().encode($0) }.map { String(decoding: $0, as: UTF8.self) }
    }

    public static func redirectURIs(json: String?) -> [String]? {
        json.flatMap { try? JSONDecoder().decode([String].self, from: Data($0.utf8)) }
    }

    public func isLive(at now: Date) -> Bool { revokedAt == nil && expiresAt > now }
}

/// Registered app instances. Every change of a live instance is one atomic statement that
/// checks it is still live, so a revocation or an expiry is never undone by a racing write.
public protocol InstanceStore: Sendable {
    /// Inserts a new instance unless its app already has `maximumPending` live instances that never
    /// completed a sign-in (counted and inserted in one statement); `false` then.
    func insertInstance(_ instance: InstanceRecord, maximumPending: Int, now: Date) async throws -> Bool
    /// How many instance rows the store holds (the expired ones until the sweeper takes them).
    func instanceCount() async throws -> Int
    /// The instance as stored, live or not (the caller checks `isLive`).
    func instance(id: String) async throws -> InstanceRecord?
    /// Every instance (of one app when `softwareID` is given), newest first.
    func instances(softwareID: String?) async throws -> [InstanceRecord]
    /// Marks a live instance used now; it then expires at `expiresAt`.
    func touchInstance(id: String, now: Date, expiresAt: Date) async throws
    /// Certifies a live instance; `false` when unknown, revoked or expired.
    func certifyInstance(id: String, as certification: InstanceCertification, now: Date) async throws -> Bool
    /// Certifies a live instance by App Attest and keeps its key and counter; `false` when not live.
    func certifyInstance(id: String, appleKeyID: String, publicKey: Data, counter: Int, now: Date) async throws -> Bool
    /// Stores `counter` only when it is greater than the stored one (compare-and-set); `false` otherwise.
    func advanceAppleCounter(id: String, to counter: Int, now: Date) async throws -> Bool
    /// `false` when unknown or already revoked.
    func revokeInstance(id: String, now: Date) async throws -> Bool
}

extension InstanceStore {
    /// Inserts an instance whatever its app's pending count.
    public func insertInstance(_ instance: InstanceRecord) async throws {
        _ = try await insertInstance(instance, maximumPending: Int(Int32.max), now: instance.createdAt)
    }
}
