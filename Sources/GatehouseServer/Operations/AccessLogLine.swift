#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif
import Foundation
import Logging

/// One request's `request` line: what the general path (`RequestLogMiddleware`) and the fast
/// path (`FastRelayHandler`) say of every request they answer. Never a query string or a header.
struct RequestLine {
    /// The relay path that answered; `nil` for Gatehouse's own endpoints.
    enum Relay: String {
        case fast
        case general
    }

    var requestID: String
    var method: String
    var path: String
    var status: Int
    /// From the request's head to the answer's head.
    var nanoseconds: Int64
    var relay: Relay?
    /// The app's own `X-Request-Id`, when it sent an acceptable one.
    var clientRequestID: String?

    /// The fields as swift-log metadata (the line written through a `Logger`).
    var metadata: Logger.Metadata {
        var metadata: Logger.Metadata = [
            "request_id": .string(requestID), "method": .string(method), "path": .string(path),
            "status": .stringConvertible(status), "ms": .string(String(decoding: Self.milliseconds(nanoseconds), as: UTF8.self)),
        ]
        if let relay { metadata["relay"] = .string(relay.rawValue) }
        if let clientRequestID { metadata["client_request_id"] = .string(clientRequestID) }
        return metadata
    }

    /// The line's own keys, sorted: the order both formats write them in.
    static let keys: Set<String> = ["client_request_id", "method", "ms", "path", "relay", "request_id", "status"]

    /// Milliseconds with one decimal, `12.3`: `%.1f` of the duration, a tie rounded up.
    static func milliseconds(_ nanoseconds: Int64) -> [UInt8] {
        var bytes: [UInt8] = []
        appendMilliseconds(nanoseconds, to: &bytes)
        return bytes
    }

    static func appendMilliseconds(_ nanoseconds: Int64, to bytes: inout [UInt8]) {
        let tenths = (max(nanoseconds, 0) + 50_000) / 100_000
        RequestLineFormatter.appendDecimal(Int(tenths / 10), to: &bytes)
        bytes.append(UInt8(ascii: "."))
        bytes.append(UInt8(ascii: "0") + UInt8(tenths % 10))
    }
}

/// Writes a `RequestLine` straight into bytes, exactly as the process's log handler would
/// have written `logger.info("request", metadata: line.metadata)`:
///
/// - text: swift-log's `StreamLogHandler`,
///   `2026-11-23T02:05:00+0000 info gatehouse: method=GET ms=0.4 path=/a relay=fast request_id=Ab3 status=200 [GatehouseServer] request`
///   (local time to the second, metadata sorted by key, values as they are);
/// - json: `JSONLogHandler`, `{"ts":"2026-11-23T02:05:00.123Z","level":"info","label":"gatehouse","msg":"request",…}`
///   (UTC with milliseconds, then the metadata sorted by key, every value a string).
///
/// No `Logger.Metadata` is built for the line's own fields; `extra` (what the logger and its
/// metadata provider add, `trace_id` and `span_id` while tracing) is merged in key order, a
/// key of the line's own winning as the handler's explicit metadata does.
struct RequestLineFormatter {
    let format: LogFormat
    /// The module swift-log names as the source of the line (`[GatehouseServer]`): both paths log from it.
    static let source = "GatehouseServer"

    /// Appends the whole line, newline included, to `bytes`.
    func append(_ line: RequestLine, label: String, extra: Logger.Metadata, clock: inout LogClock, to bytes: inout [UInt8]) {
        switch format {
        case .text:
            clock.appendLocalSeconds(to: &bytes)
            bytes.append(contentsOf: " info ".utf8)
            if label.isEmpty { bytes.removeLast() }
            bytes.append(contentsOf: label.utf8)
            bytes.append(UInt8(ascii: ":"))
        case .json:
            bytes.append(contentsOf: #"{"ts":""#.utf8)
            clock.appendUTCMilliseconds(to: &bytes)
            bytes.append(contentsOf: #"","level":"info","label":"#.utf8)
            JSONLogLine.appendString(label, to: &bytes)
            bytes.append(contentsOf: #","msg":"request""#.utf8)
        }
        let extraKeys = extra.isEmpty ? [] : extra.keys.filter { !RequestLine.keys.contains($0) }.sorted()
        var nextExtra = 0
        /// Writes the extra keys that sort before `key` (all of them when `nil`).
        func extras(before key: String?) {
            while nextExtra < extraKeys.count, key.map({ extraKeys[nextExtra] < $0 }) ?? true {
                let extraKey = extraKeys[nextExtra]
                let written = format == .json && JSONLogLine.reservedKeys.contains(extraKey) ? "metadata." + extraKey : extraKey
                if let value = extra[extraKey] { appendField(written, metadata: value, to: &bytes) }
                nextExtra += 1
            }
        }
        if let clientRequestID = line.clientRequestID {
            extras(before: "client_request_id")
            appendField("client_request_id", clientRequestID, to: &bytes)
        }
        extras(before: "method")
        appendField("method", line.method, to: &bytes)
        extras(before: "ms")
        appendField("ms", to: &bytes) { RequestLine.appendMilliseconds(line.nanoseconds, to: &$0) }
        extras(before: "path")
        appendField("path", line.path, to: &bytes)
        if let relay = line.relay {
            extras(before: "relay")
            appendField("relay", relay.rawValue, to: &bytes)
        }
        extras(before: "request_id")
        appendField("request_id", line.requestID, to: &bytes)
        extras(before: "status")
        appendField("status", to: &bytes) { Self.appendDecimal(line.status, to: &$0) }
        extras(before: nil)
        switch format {
        case .text:
            bytes.append(contentsOf: Self.textEnd)
        case .json:
            bytes.append(contentsOf: "}\n".utf8)
        }
    }

    /// What ends a text line: the source, then the message.
    private static let textEnd = Array(" [\(source)] request\n".utf8)

    /// ` key=value` (text) or `,"key":"value"` (json, escaped).
    private func appendField(_ key: String, _ value: String, to bytes: inout [UInt8]) {
        switch format {
        case .text:
            appendKey(key, to: &bytes)
            bytes.append(contentsOf: value.utf8)
        case .json:
            appendKey(key, to: &bytes)
            JSONLogLine.appendString(value, to: &bytes)
        }
    }

    /// A value of digits and a dot, which needs no escaping, written by `value`.
    private func appendField(_ key: String, to bytes: inout [UInt8], value: (inout [UInt8]) -> Void) {
        appendKey(key, to: &bytes)
        if format == .json { bytes.append(UInt8(ascii: "\"")) }
        value(&bytes)
        if format == .json { bytes.append(UInt8(ascii: "\"")) }
    }

    /// A metadata value as each handler prints it: its description (text), its JSON text as a string (json).
    private func appendField(_ key: String, metadata value: Logger.MetadataValue, to bytes: inout [UInt8]) {
        switch (format, value) {
        case (.text, _):
            appendField(key, value.description, to: &bytes)
        case (.json, .string(let string)):
            appendField(key, string, to: &bytes)
        case (.json, .stringConvertible(let convertible)):
            appendField(key, convertible.description, to: &bytes)
        case (.json, .dictionary), (.json, .array):
            var nested: [UInt8] = []
            JSONLogLine.appendJSON(value, to: &nested)
            appendField(key, String(decoding: nested, as: UTF8.self), to: &bytes)
        }
    }

    private func appendKey(_ key: String, to bytes: inout [UInt8]) {
        switch format {
        case .text:
            bytes.append(UInt8(ascii: " "))
            bytes.append(contentsOf: key.utf8)
            bytes.append(UInt8(ascii: "="))
        case .json:
            bytes.append(UInt8(ascii: ","))
            JSONLogLine.appendString(key, to: &bytes)
            bytes.append(UInt8(ascii: ":"))
        }
    }

    /// `value` (≥ 0) in decimal digits.
    static func appendDecimal(_ value: Int, to bytes: inout [UInt8]) {
        guard value > 0 else { return bytes.append(UInt8(ascii: "0")) }
        let start = bytes.count
        var rest = value
        while rest > 0 {
            bytes.append(UInt8(ascii: "0") + UInt8(rest % 10))
            rest /= 10
        }
        bytes[start...].reverse()
    }
}

/// The timestamps of log lines, formatted once per second: `StreamLogHandler`'s local time
/// (`2026-11-23T02:05:00+0000`) and `LogTimestamp`'s UTC with milliseconds
/// (`2026-11-23T02:05:00.123Z`). One per event loop, so each keeps its own cache.
struct LogClock {
    private var localSecond = Int.min
    private var localText: [UInt8] = []
    private var utcSecond = Int.min
    /// `2026-11-23T02:05:00.`: the UTC time up to the milliseconds.
    private var utcPrefix: [UInt8] = []

    /// The text format's timestamp: `strftime("%Y-%m-%dT%H:%M:%S%z")` of the local time.
    mutating func appendLocalSeconds(to bytes: inout [UInt8]) {
        let seconds = Self.now().seconds
        if seconds != localSecond {
            localSecond = seconds
            localText = Self.localTime(seconds)
        }
        bytes.append(contentsOf: localText)
    }

    /// The json format's timestamp, as `LogTimestamp.now()` writes it.
    mutating func appendUTCMilliseconds(to bytes: inout [UInt8]) {
        let (seconds, milliseconds) = Self.now()
        if seconds != utcSecond {
            utcSecond = seconds
            utcPrefix = Array(LogTimestamp.format(seconds: seconds, milliseconds: 0).utf8.dropLast(4))
        }
        bytes.append(contentsOf: utcPrefix)
        bytes.append(UInt8(ascii: "0") + UInt8(milliseconds / 100))
        bytes.append(UInt8(ascii: "0") + UInt8(milliseconds / 10 % 10))
        bytes.append(UInt8(ascii: "0") + UInt8(milliseconds % 10))
        bytes.append(UInt8(ascii: "Z"))
    }

    /// The time as `LogTimestamp.now()` reads it.
    private static func now() -> (seconds: Int, milliseconds: Int) {
        let milliseconds = Int((Date().timeIntervalSince1970 * 1000).rounded(.down))
        return (milliseconds / 1000, milliseconds % 1000)
    }

    private static func localTime(_ seconds: Int) -> [UInt8] {
        var time = time_t(seconds)
        var parts = tm()
        guard localtime_r(&time, &parts) != nil else { return Array("<unknown>".utf8) }
        var buffer = [Int8](repeating: 0, count: 64)
        let count = strftime(&buffer, buffer.count, "%Y-%m-%dT%H:%M:%S%z", &parts)
        return buffer[..<count].map { UInt8(bitPattern: $0) }
    }
}
