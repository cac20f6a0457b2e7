#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif
import GatehouseCore
public import Logging
import OTel
import Synchronization

/// How `gatehouse serve` writes its logs (`--log-format`, `LOG_FORMAT`).
public enum LogFormat: String, Sendable, CaseIterable {
    /// swift-log's plain lines, for a terminal.
    case text
    /// One JSON object a line, for a log shipper.
    case json
}

/// What the request being served is, for every log line written while it runs. Set by the
/// request middleware around the route; read by `GatehouseLogging.metadataProvider`.
public enum RequestScope {
    /// Gatehouse's id of the request being served (`X-Request-Id` of the answer); `nil` outside a request.
    @TaskLocal public static var requestID: String?
}

/// The process's logging: the format of standard error, the audit stream's destination, and
/// the metadata every line carries (`request_id`, and `trace_id`/`span_id` while tracing).
public enum GatehouseLogging {
    /// Adds `request_id` from `RequestScope` and, when a span is current, `trace_id`,
    /// `span_id` and `trace_flags` (swift-otel's provider; nothing while tracing is off).
    public static let metadataProvider = Logger.MetadataProvider {
        var metadata = traceProvider.get()
        if let requestID = RequestScope.requestID { metadata["request_id"] = .string(requestID) }
        return metadata
    }

    private static let traceProvider = OTel.makeLoggingMetadataProvider()

    private static let bootstrapped = Atomic(false)

    /// Sets swift-log up, once per process: `format` on standard error at `level`; the audit
    /// stream (the logger labelled `gatehouse.audit`) as JSON lines appended to `auditFile`
    /// (created 0600) when given, else on standard error with the rest. Audit lines are
    /// written at `notice`, whatever `level` says.
    ///
    /// Returns the access log that writes the `request` lines in `format` to standard error,
    /// under the lock of its other lines (`AccessLog`).
    ///
    /// Throws when the audit file cannot be opened, or when logging was already set up.
    @discardableResult
    public static func bootstrap(format: LogFormat, level: Logger.Level, auditFile: String?) throws -> AccessLog {
        guard !bootstrapped.load(ordering: .acquiring) else { throw LoggingSetupError.alreadySetUp }
        let auditSink = try auditFile.map(openAuditFile)
        guard bootstrapped.compareExchange(expected: false, desired: true, ordering: .acquiringAndReleasing).exchanged else {
            if let auditSink { close(auditSink.descriptor) }
            throw LoggingSetupError.alreadySetUp
        }
        LoggingSystem.bootstrap({ label, provider in
            makeHandler(label: label, format: format, level: level, auditSink: auditSink, standardError: FileDescriptorSink.standardError,
                        metadataProvider: provider)
        }, metadataProvider: metadataProvider)
        return AccessLog(format: format, sink: standardErrorSink(format))
    }

    /// The sink of standard error for `format`, the one its lines are written through: swift-log's
    /// stream (text) or `FileDescriptorSink.standardError` (json).
    static func standardErrorSink(_ format: LogFormat) -> any LogLineSink {
        switch format {
        case .text: StandardErrorStreamSink.shared
        case .json: FileDescriptorSink.standardError
        }
    }

    /// The handler of the logger labelled `label` (split out of `bootstrap` for the tests).
    static func makeHandler(label: String, format: LogFormat, level: Logger.Level, auditSink: (any LogLineSink)?,
                            standardError: any LogLineSink, metadataProvider: Logger.MetadataProvider?) -> any LogHandler {
        let isAudit = label == AuditLog.label
        let handlerLevel = isAudit ? min(level, .notice) : level
        if isAudit, let auditSink {
            return JSONLogHandler(label: label, sink: auditSink, level: handlerLevel, metadataProvider: metadataProvider)
        }
        switch format {
        case .json:
            return JSONLogHandler(label: label, sink: standardError, level: handlerLevel, metadataProvider: metadataProvider)
        case .text:
            var handler = StreamLogHandler.standardError(label: label, metadataProvider: metadataProvider)
            handler.logLevel = handlerLevel
            return handler
        }
    }

    /// Opens (creating, mode 0600) the audit file for appending.
    static func openAuditFile(_ path: String) throws -> FileDescriptorSink {
        let descriptor = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0o600)
        guard descriptor >= 0 else { throw LoggingSetupError.auditFile(path, errorNumber: errno) }
        return FileDescriptorSink(descriptor: descriptor)
    }
}

/// Logging could not be set up as asked.
public struct LoggingSetupError: Error, CustomStringConvertible {
    public let description: String

    static func auditFile(_ path: String, errorNumber: Int32) -> LoggingSetupError {
        LoggingSetupError(description: "cannot open the audit file '\(path)' for appending: \(String(cString: strerror(errorNumber)))")
    }

    static let alreadySetUp = LoggingSetupError(description: "logging is already set up in this process")
}
