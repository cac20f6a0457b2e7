public import Foundation

/// The outcome of one try of an e-mailed certification code.
public enum CertificationAttempt: Sendable, Equatable {
    /// The right code (now, or at an earlier try): the sealed sign-in.
    case verified(Data)
    case wrong(remaining: Int)
    /// Every allowed try is used: the sign-in is locked until it expires.
    case locked
    /// No such pending sign-in, or it expired.
    case unknown
}

/// Sign-ins paused for manual certification: each keeps the hash of its e-mailed code and how
/// many tries were made, counted and compared in one atomic statement.
public protocol CertificationStore: Sendable {
    func insertCertification(idHash: String, sealed: Data, codeHash: String, expiresAt: Date) async throws
    /// One try: counts it and compares `codeHash`; `.locked` once `maximumAttempts` were used (even
    /// for the right code afterwards); a verified row answers `.verified` again without counting.
    func attemptCertification(idHash: String, codeHash: String, maximumAttempts: Int, now: Date) async throws -> CertificationAttempt
    /// Deletes and returns the sealed value of a verified live row; `nil` otherwise.
    func consumeCertification(idHash: String, now: Date) async throws -> Data?
}
