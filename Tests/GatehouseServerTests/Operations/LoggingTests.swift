import Foundation
import GatehouseCore
import GatehouseStore
@testable import GatehouseServer
import Hummingbird
import HummingbirdTesting
import Logging
import Synchronization
import Testing

/// The JSON log handler (shape, escaping), where each logger writes (audit file, standard
/// error), and the request id reaching every line written while a request is served.
struct LoggingTests {
    /// Keeps the lines a handler writes.
    final class CapturedLines: LogLineSink {
        private let lines = Mutex<[[UInt8]]>([])

        /// Takes everything; a call with nothing (`AccessLog.flush()` asking for the end of a
        /// line begun earlier) writes nothing.
        func write(_ lines: [UInt8], patience: Duration) -> Int {
            if !lines.isEmpty { self.lines.withLock { $0.append(lines) } }
            return lines.count
        }

        var all: [[UInt8]] { lines.withLock { $0 } }

        /// Every line parsed as a JSON object (a line that does not parse fails the test).
        func objects(sourceLocation: SourceLocation = #_sourceLocation) throws -> [[String: Any]] {
            try all.map { line in
                let object = try JSONSerialization.jsonObject(with: Data(line))
                return try #require(object as? [String: Any], sourceLocation: sourceLocation)
            }
        }
    }

    static func logger(_ sink: CapturedLines, label: String = "gatehouse", level: Logger.Level = .info,
                       provider: Logger.MetadataProvider? = nil) -> Logger {
        Logger(label: label) { label in JSONLogHandler(label: label, sink: sink, level: level, metadataProvider: provider) }
    }

    @Test func aJSONLineHasTheFixedFieldsThenTheMetadataAsStrings() throws {
        let sink = CapturedLines()
        Self.logger(sink).notice("request", metadata: ["status": .stringConvertible(200), "path": "/oauth/token"])
        let object = try #require(try sink.objects().first)
        #expect(object["level"] as? String == "notice")
        #expect(object["label"] as? String == "gatehouse")
        #expect(object["msg"] as? String == "request")
        #expect(object["status"] as? String == "200")
        #expect(object["path"] as? String == "/oauth/token")
        let timestamp = try #require(object["ts"] as? String)
        #expect(timestamp.wholeMatch(of: /\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z/) != nil, "\(timestamp)")
        let line = try #require(sink.all.first)
        #expect(line.last == UInt8(ascii: "\n"))
        #expect(line.dropLast().contains(UInt8(ascii: "\n")) == false)
        #expect(String(decoding: line, as: UTF8.self).hasPrefix(#"{"ts":""#))
    }

    /// Quotes, backslashes, every control character, DEL, U+2028 and U+2029, multi-byte
    /// characters around them: one line each, and the values come back unchanged.
    @Test func everyStringIsEscapedAndComesBackUnchanged() throws {
        let sink = CapturedLines()
        let controls = String(decoding: (0..<32).map { UInt8($0) } + [0x7F], as: UTF8.self)
        let tricky = "quote \" backslash \\ slash / line\u{2028}para\u{2029}end €’ é 🙂 \r\n\t" + controls
        Self.logger(sink).info("\(tricky)", metadata: ["value": .string(tricky), "k\"ey\n": "v"])
        let line = try #require(sink.all.first)
        #expect(line.filter { $0 < 0x20 } == [UInt8(ascii: "\n")], "a raw control character in the line")
        #expect(!String(decoding: line, as: UTF8.self).contains("\u{2028}"))
        #expect(!String(decoding: line, as: UTF8.self).contains("\u{2029}"))
        let object = try #require(try sink.objects().first)
        #expect(object["msg"] as? String == tricky)
        #expect(object["value"] as? String == tricky)
        #expect(object["k\"ey\n"] as? String == "v")
    }

    /// A nested value is one string holding its JSON text: the line stays flat.
    @Test func nestedMetadataIsFlattenedToAJSONString() throws {
        let sink = CapturedLines()
        Self.logger(sink).warning("configuration reload refused", metadata: [
            "problems": .array(["clients[0]: \"x\" is unknown", .dictionary(["line": .stringConvertible(3)])]),
            "detail": .dictionary(["b": "2", "a": .array(["1"])]),
        ])
        let object = try #require(try sink.objects().first)
        let problems = try #require(object["problems"] as? String)
        let parsed = try #require(try JSONSerialization.jsonObject(with: Data(problems.utf8)) as? [Any])
        #expect(parsed.first as? String == "clients[0]: \"x\" is unknown")
        #expect((parsed.last as? [String: String])?["line"] == "3")
        #expect(object["detail"] as? String == #"{"a":["1"],"b":"2"}"#)
    }

    /// Metadata named like a fixed field never makes a second key of that name.
    @Test func metadataNamedLikeAFixedFieldIsRenamed() throws {
        let sink = CapturedLines()
        Self.logger(sink).info("real", metadata: ["msg": "forged", "level": "forged"])
        let text = String(decoding: try #require(sink.all.first), as: UTF8.self)
        #expect(text.components(separatedBy: #""msg":"#).count == 2)
        let object = try #require(try sink.objects().first)
        #expect(object["msg"] as? String == "real")
        #expect(object["metadata.msg"] as? String == "forged")
        #expect(object["metadata.level"] as? String == "forged")
    }

    @Test func timestampsAreUTCWithMilliseconds() {
        #expect(LogTimestamp.format(seconds: 1_800_000_000, milliseconds: 7) == "2027-01-15T08:00:00.007Z")
        #expect(LogTimestamp.format(seconds: 0, milliseconds: 999) == "1970-01-01T00:00:00.999Z")
    }

    /// The audit logger writes JSON to the audit file whatever the format; others follow the
    /// format; audit lines pass at `notice` even when the level is `warning`.
    @Test func theAuditLoggerWritesToItsOwnSink() throws {
        let audit = CapturedLines()
        let standardError = CapturedLines()
        let auditHandler = GatehouseLogging.makeHandler(label: AuditLog.label, format: .text, level: .warning, auditSink: audit,
                                                        standardError: standardError, metadataProvider: nil)
        AuditLog(logger: Logger(label: AuditLog.label) { _ in auditHandler })
            .record(.revoke, clientID: "com.example.app", subject: "user-1", reason: "app asked")
        let line = try #require(try audit.objects().first)
        #expect(line["audit_event"] as? String == "revoke")
        #expect(line["client_id"] as? String == "com.example.app")
        #expect(line["subject_hash"] as? String == AuditLog.subjectHash("user-1"))
        #expect(standardError.all.isEmpty)

        let other = GatehouseLogging.makeHandler(label: "gatehouse", format: .json, level: .warning, auditSink: audit,
                                                 standardError: standardError, metadataProvider: nil)
        let logger = Logger(label: "gatehouse") { _ in other }
        logger.notice("dropped")
        logger.warning("kept")
        #expect(try standardError.objects().map { $0["msg"] as? String } == ["kept"])
        #expect(GatehouseLogging.makeHandler(label: "gatehouse", format: .text, level: .info, auditSink: nil,
                                             standardError: standardError, metadataProvider: nil) is StreamLogHandler)
    }

    @Test func theAuditFileIsCreatedPrivateAndAppendedTo() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("gatehouse-audit-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let path = directory.appendingPathComponent("audit.log").path
        for round in 1...2 {
            let sink = try GatehouseLogging.openAuditFile(path)
            sink.write(Array("{\"round\":\"\(round)\"}\n".utf8))
            close(sink.descriptor)
        }
        #expect(try String(contentsOfFile: path, encoding: .utf8) == "{\"round\":\"1\"}\n{\"round\":\"2\"}\n")
        let permissions = try FileManager.default.attributesOfItem(atPath: path)[.posixPermissions] as? Int
        #expect(permissions == 0o600)
    }

    @Test func anAuditFileThatCannotBeOpenedIsAClearError() throws {
        let path = "/nonexistent-gatehouse-directory/audit.log"
        #expect {
            try GatehouseLogging.openAuditFile(path)
        } throws: { error in
            let description = (error as? LoggingSetupError)?.description ?? ""
            return description.contains(path) && description.contains("audit file")
        }
    }

    /// A line a route writes while the request runs carries the request's id (the one the
    /// answer's `X-Request-Id` gives the app); a line written outside a request has none.
    @Test func aLogLineWrittenInsideARouteCarriesTheRequestID() async throws {
        let test = try await TestGatehouse.make()
        let sink = CapturedLines()
        let routeLogger = Self.logger(sink, provider: GatehouseLogging.metadataProvider)
        let router = Router(context: GatehouseRequestContext.self)
        router.add(middleware: RequestLogMiddleware(logger: test.gatehouse.logger, routes: ["/probe": [.get]],
                                                    holder: GatehouseHolder(test.gatehouse)))
        router.get("/probe") { _, _ in
            routeLogger.info("inside the route")
            return "ok"
        }
        let requestID = try await Application(router: router).test(.router) { client in
            let response = try await client.execute(uri: "/probe", method: .get)
            #expect(response.status == .ok)
            return try #require(response.headers[.requestID])
        }
        routeLogger.info("outside any request")
        try await test.store.close()
        let lines = try sink.objects()
        #expect(lines.count == 2)
        #expect(lines.first?["request_id"] as? String == requestID)
        #expect(lines.last?["request_id"] == nil)
    }
}
