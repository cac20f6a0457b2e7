#if canImport(Glibc)
@preconcurrency import Glibc
#elseif canImport(Musl)
@preconcurrency import Musl
#elseif canImport(Darwin)
@preconcurrency import Darwin
#endif
import Foundation
import Logging
import Synchronization

/// Where finished log lines go: one call per line, or per batch of whole lines (`AccessLog`).
protocol LogLineSink: Sendable {
    /// Writes `lines` (whole lines, each ended by `\n`), or as many of them as the destination
    /// takes without waiting longer than `patience`. Returns how many bytes of `lines` it took
    /// (`LogLineWriter.write(_:patience:)`): the bytes after them are whole lines not written.
    func write(_ lines: [UInt8], patience: Duration) -> Int
}

extension LogLineSink {
    /// Writes one line (or batch) without waiting: what the destination does not take is lost.
    func write(_ line: [UInt8]) {
        _ = write(line, patience: .zero)
    }
}

/// A file descriptor (standard error, the audit file): each call is written under a lock, so
/// lines of concurrent tasks never interleave, and a line begun is finished before the next
/// starts (`LogLineWriter`).
final class FileDescriptorSink: LogLineSink {
    static let standardError = FileDescriptorSink(descriptor: 2)

    let descriptor: Int32
    private let writer: Mutex<LogLineWriter>

    init(descriptor: Int32) {
        self.descriptor = descriptor
        writer = Mutex(LogLineWriter(descriptor: descriptor))
    }

    func write(_ lines: [UInt8], patience: Duration) -> Int {
        writer.withLock { $0.write(lines, patience: patience) }
    }
}

/// Standard error under the lock of the C `stderr` stream, the one swift-log's
/// `StreamLogHandler` (`--log-format text`) takes for each line: a batch written here never
/// lands inside one of its lines, nor one of its lines inside a batch. (A line of ours whose
/// end standard error did not take within `LogLineWriter.tornLinePatience` is finished by our
/// next write; a line of swift-log's written meanwhile would follow its start.)
final class StandardErrorStreamSink: LogLineSink {
    static let shared = StandardErrorStreamSink()

    /// The C stream, read once: `stderr` is a C global the compiler cannot prove unchanged.
    nonisolated(unsafe) private static let stream = stderr
    /// Only ever taken inside the stream's lock.
    private let writer = Mutex(LogLineWriter(descriptor: 2))

    func write(_ lines: [UInt8], patience: Duration) -> Int {
        flockfile(Self.stream)
        defer { funlockfile(Self.stream) }
        // `stderr` is unbuffered: nothing of the stream's own waits to be written before these bytes.
        return writer.withLock { $0.write(lines, patience: patience) }
    }
}

/// swift-log's handler for `--log-format json`: one JSON object a line,
/// `{"ts":"2026-11-23T19:30:56.123Z","level":"info","label":"gatehouse","msg":"request", …}`,
/// then the metadata (the logger's, the metadata provider's — `request_id`, `trace_id` —,
/// the line's own, in that order of precedence) as strings, keys sorted.
struct JSONLogHandler: LogHandler {
    let label: String
    let sink: any LogLineSink
    var logLevel: Logger.Level
    var metadata: Logger.Metadata = [:]
    var metadataProvider: Logger.MetadataProvider?

    init(label: String, sink: any LogLineSink, level: Logger.Level, metadataProvider: Logger.MetadataProvider?) {
        self.label = label
        self.sink = sink
        self.logLevel = level
        self.metadataProvider = metadataProvider
    }

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        var line = JSONLogLine()
        line.field("ts", LogTimestamp.now())
        line.field("level", event.level.rawValue)
        line.field("label", label)
        line.field("msg", event.message.description)
        let fields = effectiveMetadata(event)
        for key in fields.keys.sorted() {
            guard let value = fields[key] else { continue }
            line.field(JSONLogLine.reservedKeys.contains(key) ? "metadata." + key : key, metadata: value)
        }
        sink.write(line.finish())
    }

    private func effectiveMetadata(_ event: LogEvent) -> Logger.Metadata {
        var fields = metadata
        if let provided = metadataProvider?.get(), !provided.isEmpty {
            fields.merge(provided) { _, provided in provided }
        }
        if let explicit = event.metadata, !explicit.isEmpty {
            fields.merge(explicit) { _, explicit in explicit }
        }
        if let error = event.error {
            fields["error.type"] = .string(String(reflecting: type(of: error)))
        }
        return fields
    }
}

/// The time of a log line: RFC 3339 in UTC with milliseconds, `2026-11-23T19:30:56.123Z`.
enum LogTimestamp {
    static func now() -> String {
        let milliseconds = Int((Date().timeIntervalSince1970 * 1000).rounded(.down))
        return format(seconds: milliseconds / 1000, milliseconds: milliseconds % 1000)
    }

    static func format(seconds: Int, milliseconds: Int) -> String {
        var time = time_t(seconds)
        var parts = tm()
        gmtime_r(&time, &parts)
        var bytes: [UInt8] = []
        bytes.reserveCapacity(24)
        append(Int(parts.tm_year) + 1900, digits: 4, to: &bytes)
        bytes.append(UInt8(ascii: "-"))
        append(Int(parts.tm_mon) + 1, digits: 2, to: &bytes)
        bytes.append(UInt8(ascii: "-"))
        append(Int(parts.tm_mday), digits: 2, to: &bytes)
        bytes.append(UInt8(ascii: "T"))
        append(Int(parts.tm_hour), digits: 2, to: &bytes)
        bytes.append(UInt8(ascii: ":"))
        append(Int(parts.tm_min), digits: 2, to: &bytes)
        bytes.append(UInt8(ascii: ":"))
        append(Int(parts.tm_sec), digits: 2, to: &bytes)
        bytes.append(UInt8(ascii: "."))
        append(milliseconds, digits: 3, to: &bytes)
        bytes.append(UInt8(ascii: "Z"))
        return String(decoding: bytes, as: UTF8.self)
    }

    private static func append(_ value: Int, digits: Int, to bytes: inout [UInt8]) {
        var divisor = 1
        for _ in 1..<digits { divisor *= 10 }
        var rest = value
        while divisor > 0 {
            bytes.append(UInt8(ascii: "0") + UInt8((rest / divisor) % 10))
            rest %= divisor
            divisor /= 10
        }
    }
}
