import Crypto
public import Logging

/// Security events, one line each on the logger labelled `gatehouse.audit` (its own file when
/// `observability.audit.file` is set): what happened, to which client, for which subject and
/// why. The subject is written as the first 16 hex digits of its SHA-256 (pseudonymous:
/// whoever knows a subject can find its events; the log alone does not name anyone). Never a token.
public struct AuditLog: Sendable {
    public static let label = "gatehouse.audit"
    let logger: Logger

    public init(logger: Logger = Logger(label: AuditLog.label)) {
        self.logger = logger
    }

    public func record(_ event: AuditEvent, clientID: String?, subject: String?, reason: String? = nil,
                       metadata: Logger.Metadata = [:]) {
        var fields = metadata
        fields["audit_event"] = .string(event.rawValue)
        // One rule for every event: an app instance is written as its app (client_id) and its
        // label (`instance`: the first characters of the hash of its random part), never in full,
        // so an instance id found in the audit stream is no credential and a made-up one is no payload.
        if let clientID {
            if let (app, _) = InstanceID.split(clientID) {
                fields["client_id"] = .string(app)
                fields["instance"] = .string(InstanceID.label(clientID))
            } else {
                fields["client_id"] = .string(clientID)
            }
        }
        if let subject { fields["subject_hash"] = .string(Self.subjectHash(subject)) }
        if let reason { fields["reason"] = .string(reason) }
        logger.notice("\(event.rawValue)", metadata: fields)
        GatehouseMetrics.audit(event.rawValue)
    }

    /// The first 16 hex digits of the subject's SHA-256.
    public static func subjectHash(_ subject: String) -> String {
        SHA256.hash(data: Array(subject.utf8)).prefix(8).map { byte in
            let hex = String(byte, radix: 16)
            return byte < 16 ? "0" + hex : hex
        }.joined()
    }
}

/// The audit stream's events.
public enum AuditEvent: String, Sendable, CaseIterable {
    case sign_in, refresh, reuse_detected, family_revoked, revoke, logout, admin_revocation, rate_limited
    case instance_registered, instance_certified, instance_revoked, certification_locked, web_session
    case sign_in_failed
    /// The in-app sign-in's wrong-password breaker tripped (once per window, whichever instance).
    case sign_in_breaker_tripped
}
