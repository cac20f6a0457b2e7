#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif
import Foundation
import GatehouseCore
@testable import GatehouseServer
import Logging
import NIOCore
import NIOPosix
import Synchronization
import Testing

/// The access log: its lines are byte for byte what the process's log handler wrote for the
/// same request, they are written in one batch per event-loop pass, at once past the cap, never
/// torn between loops, never torn nor glued by a reader that stalls (those it cannot write are
/// dropped whole and counted), and not at all when off.
struct AccessLogTests {
    typealias CapturedLines = LoggingTests.CapturedLines

    /// A text stream that keeps what `StreamLogHandler` writes.
    final class CapturedText: TextOutputStream, Sendable {
        private let text = Mutex("")
        func write(_ string: String) { text.withLock { $0 += string } }
        var all: String { text.withLock { $0 } }
    }

    static let fast = RequestLine(requestID: "Ab3-1x", method: "GET", path: "/api/contracts/1", status: 200,
                                  nanoseconds: 432_100, relay: .fast, clientRequestID: "app-42")
    static let own = RequestLine(requestID: "Zz9", method: "POST", path: "/oauth/token", status: 400,
                                 nanoseconds: 12_345_678_901, relay: nil, clientRequestID: nil)
    /// What a metadata provider adds while tracing (and the request id the line has already).
    static let traced: Logger.Metadata = [
        "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "span_id": "00f067aa0ba902b7", "trace_flags": "01", "request_id": "Ab3-1x",
        "msg": "a key named like a fixed field",
    ]

    /// A logger at `level` whose lines go nowhere (the access log reads its level, label and metadata).
    static func logger(level: Logger.Level = .info, provided: Logger.Metadata = [:]) -> Logger {
        let provider = Logger.MetadataProvider { provided }
        return Logger(label: "gatehouse") { label in
            JSONLogHandler(label: label, sink: CapturedLines(), level: level, metadataProvider: provider)
        }
    }

    static func event(_ line: RequestLine) -> LogEvent {
        LogEvent(level: .info, message: "request", metadata: line.metadata, source: RequestLineFormatter.source,
                 file: #fileID, function: #function, line: #line)
    }

    /// Every line of every write, parsed as a JSON object (a line that does not parse fails the test).
    static func objects(_ sink: CapturedLines) throws -> [[String: Any]] {
        try sink.all.joined().split(separator: UInt8(ascii: "\n")).map { line in
            try #require(try JSONSerialization.jsonObject(with: Data(line)) as? [String: Any])
        }
    }

    static func text(_ bytes: [[UInt8]]) -> String {
        String(decoding: bytes.joined(), as: UTF8.self)
    }

    /// `body` until its two lines were stamped within one second (a test at a second's edge
    /// tries again): their first 26 characters hold the time to the second in both formats.
    static func sameSecond(_ body: () -> (String, String)) -> (String, String) {
        var lines = body()
        for _ in 0..<3 where lines.0.prefix(26) != lines.1.prefix(26) { lines = body() }
        return lines
    }

    // MARK: The lines

    @Test(arguments: [(fast, [:]), (own, [:]), (fast, traced)])
    func aTextLineIsWhatStreamLogHandlerWrites(line: RequestLine, provided: Logger.Metadata) {
        let (ours, theirs) = Self.sameSecond {
            let sink = CapturedLines()
            AccessLog(format: .text, sink: sink).record(line, logger: Self.logger(), extra: AccessLog.extra(of: Self.logger(provided: provided)))
            let stream = CapturedText()
            StreamLogHandler(label: "gatehouse", stream: stream, metadataProvider: Logger.MetadataProvider { provided })
                .log(event: Self.event(line))
            return (Self.text(sink.all), stream.all)
        }
        // Byte for byte after the time stamp (a machine that stalls the test past a second's edge
        // three times stamps them apart); the stamps in the same format.
        #expect(ours.dropFirst(24) == theirs.dropFirst(24), "\(ours)\n\(theirs)")
        let shape = /\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d{4} info gatehouse: .* \[GatehouseServer\] request\n/
        #expect(ours.wholeMatch(of: shape) != nil, "\(ours)")
        #expect(theirs.wholeMatch(of: shape) != nil, "\(theirs)")
    }

    @Test(arguments: [(fast, [:]), (own, [:]), (fast, traced)])
    func aJSONLineIsWhatJSONLogHandlerWrites(line: RequestLine, provided: Logger.Metadata) throws {
        let (ours, theirs) = Self.sameSecond {
            let sink = CapturedLines()
            AccessLog(format: .json, sink: sink).record(line, logger: Self.logger(), extra: AccessLog.extra(of: Self.logger(provided: provided)))
            let handlerSink = CapturedLines()
            JSONLogHandler(label: "gatehouse", sink: handlerSink, level: .info, metadataProvider: Logger.MetadataProvider { provided })
                .log(event: Self.event(line))
            return (Self.text(sink.all), Self.text(handlerSink.all))
        }
        // The same line but for the milliseconds of `ts`, each stamped when written.
        let milliseconds = /"ts":"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\.\d{3}Z"/
        #expect(ours.firstMatch(of: milliseconds) != nil, "\(ours)")
        #expect(ours.replacing(milliseconds) { "\"ts\":\"\($0.1)\"" } == theirs.replacing(milliseconds) { "\"ts\":\"\($0.1)\"" })
        let object = try #require(try JSONSerialization.jsonObject(with: Data(ours.utf8)) as? [String: String])
        #expect(object["relay"] == line.relay?.rawValue && object["status"] == String(line.status))
    }

    @Test func millisecondsAreWrittenAsPrintfWouldWithOneDecimal() {
        for nanoseconds: Int64 in [0, 49_999, 50_001, 432_100, 999_999, 1_949_999, 12_345_678_901, 86_400_000_000_000] {
            let written = String(decoding: RequestLine.milliseconds(nanoseconds), as: UTF8.self)
            #expect(written == String(format: "%.1f", Double(nanoseconds) / 1_000_000), "\(nanoseconds) ns")
        }
    }

    // MARK: Batches

    /// Waits (up to 5 s) until `sink` holds `writes` writes; the writes.
    static func writes(_ count: Int, in sink: CapturedLines) async throws -> [[UInt8]] {
        let deadline = ContinuousClock.now + .seconds(5)
        while sink.all.count < count, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(5)) }
        try await Task.sleep(for: .milliseconds(50))  // and no more than that
        return sink.all
    }

    static func line(_ number: Int) -> RequestLine {
        var line = fast
        line.requestID = "r\(number)"
        return line
    }

    @Test func theLinesOfOneLoopPassAreWrittenInOneWriteOnceThePassEnds() async throws {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let sink = CapturedLines()
        let accessLog = AccessLog(format: .json, sink: sink)
        let logger = Self.logger()
        let writtenDuringThePass = try await group.next().submit {
            for number in 0..<200 { accessLog.record(Self.line(number), logger: logger) }
            return sink.all.count
        }.get()
        #expect(writtenDuringThePass == 0)
        let writes = try await Self.writes(1, in: sink)
        #expect(writes.count == 1)
        let objects = try Self.objects(sink)
        #expect(objects.map { $0["request_id"] as? String } == (0..<200).map { "r\($0)" })
        try await group.shutdownGracefully()
    }

    @Test func aLineOfAnIdleLoopIsWrittenWhenItsPassEndsWithNothingElseToRun() async throws {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let sink = CapturedLines()
        let accessLog = AccessLog(format: .text, sink: sink)
        let logger = Self.logger()
        group.next().execute { accessLog.record(Self.fast, logger: logger) }
        let writes = try await Self.writes(1, in: sink)
        #expect(writes.count == 1)
        #expect(Self.text(writes).hasSuffix("[GatehouseServer] request\n"))
        try await group.shutdownGracefully()
    }

    @Test func aBufferPastTheCapIsWrittenAtOnce() async throws {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let sink = CapturedLines()
        let accessLog = AccessLog(format: .json, sink: sink, capacity: 1024)
        let logger = Self.logger()
        let (linesBeforeTheWrite, written) = try await group.next().submit {
            var count = 0
            while sink.all.isEmpty, count < 1000 {
                accessLog.record(Self.line(count), logger: logger)
                count += 1
            }
            return (count, sink.all.first ?? [])
        }.get()
        let lineLength = written.count / max(linesBeforeTheWrite, 1)
        #expect(written.count >= 1024 && written.count < 1024 + lineLength, "\(written.count) bytes in \(linesBeforeTheWrite) lines")
        #expect(try Self.objects(sink).count == linesBeforeTheWrite)
        try await group.shutdownGracefully()
    }

    @Test func aLineOffAnEventLoopIsWrittenAtOnce() {
        let sink = CapturedLines()
        AccessLog(format: .text, sink: sink).record(Self.fast, logger: Self.logger())
        #expect(sink.all.count == 1)
    }

    /// Two loops, each with many lines and a small cap (many writes): every write holds whole
    /// lines, every line is there once.
    @Test func linesOfTwoLoopsNeverInterleave() async throws {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 2)
        let sink = CapturedLines()
        let accessLog = AccessLog(format: .text, sink: sink, capacity: 4096)
        let logger = Self.logger()
        let loops = [group.next(), group.next()]
        #expect(loops[0] !== loops[1])
        try await withThrowingTaskGroup(of: Void.self) { tasks in
            for (index, loop) in loops.enumerated() {
                tasks.addTask {
                    for batch in 0..<20 {
                        try await loop.submit {
                            for number in 0..<250 { accessLog.record(Self.line(index * 100_000 + batch * 1000 + number), logger: logger) }
                        }.get()
                    }
                }
            }
            try await tasks.waitForAll()
        }
        await accessLog.flush()
        let writes = sink.all
        #expect(writes.count > 2)
        var ids: [String] = []
        for write in writes {
            #expect(write.last == UInt8(ascii: "\n"))
            for line in String(decoding: write, as: UTF8.self).split(separator: "\n") {
                let match = line.wholeMatch(of: /\S+ info gatehouse: client_request_id=app-42 method=GET ms=0\.4 path=\/api\/contracts\/1 relay=fast request_id=(r\d+) status=200 \[GatehouseServer\] request/)
                #expect(match != nil, "a torn line: \(line)")
                if let match { ids.append(String(match.1)) }
            }
        }
        #expect(ids.count == 10_000)
        #expect(Set(ids).count == 10_000)
        try await group.shutdownGracefully()
    }

    @Test func flushReturnsOnceEveryLoopsLinesAreWritten() async throws {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 2)
        let sink = CapturedLines()
        let accessLog = AccessLog(format: .json, sink: sink)
        let logger = Self.logger()
        for loop in [group.next(), group.next()] {
            try await loop.submit { for number in 0..<3 { accessLog.record(Self.line(number), logger: logger) } }.get()
        }
        await accessLog.flush()
        #expect(try Self.objects(sink).count == 6)
        try await group.shutdownGracefully()
    }

    // MARK: A stalled reader

    /// A pipe as standard error is when the process reading it made it non-blocking: a write
    /// it has no room for fails with `EAGAIN`. It holds one page (4 KiB), a quarter of a batch.
    struct StalledPipe: Sendable {
        let readEnd: Int32
        let writeEnd: Int32
        /// Bytes the pipe holds when full.
        let size: Int

        /// `F_SETPIPE_SZ`, `F_GETPIPE_SZ` (Linux, `<fcntl.h>` under `_GNU_SOURCE`).
        static let setSize: Int32 = 1031
        static let getSize: Int32 = 1032

        init() throws {
            var ends: [Int32] = [-1, -1]
            guard pipe(&ends) == 0 else { throw TestFailure("pipe(2) failed") }
            (readEnd, writeEnd) = (ends[0], ends[1])
            _ = fcntl(writeEnd, Self.setSize, 4096)
            size = Int(fcntl(writeEnd, Self.getSize))
            for end in ends { _ = fcntl(end, F_SETFL, fcntl(end, F_GETFL) | O_NONBLOCK) }
        }

        /// Whether a write would find no room.
        var isFull: Bool {
            var descriptor = pollfd(fd: writeEnd, events: Int16(POLLOUT), revents: 0)
            return poll(&descriptor, 1, 0) == 0
        }

        /// Reads everything the pipe holds now.
        func drain(into bytes: inout [UInt8]) {
            var chunk = [UInt8](repeating: 0, count: 65536)
            while true {
                let count = chunk.withUnsafeMutableBytes { read(readEnd, $0.baseAddress!, $0.count) }
                guard count > 0 else { return }
                bytes += chunk[..<count]
            }
        }

        /// Reads on a thread of its own until the write end is closed; what it read.
        func readToTheEnd() async -> [UInt8] {
            await withCheckedContinuation { continuation in
                Thread.detachNewThread {
                    var bytes: [UInt8] = []
                    var chunk = [UInt8](repeating: 0, count: 65536)
                    while true {
                        let count = chunk.withUnsafeMutableBytes { read(readEnd, $0.baseAddress!, $0.count) }
                        if count > 0 {
                            bytes += chunk[..<count]
                        } else if count == 0 {
                            break  // the write end is closed
                        } else if errno == EAGAIN {
                            var descriptor = pollfd(fd: readEnd, events: Int16(POLLIN), revents: 0)
                            _ = poll(&descriptor, 1, -1)
                        } else if errno != EINTR {
                            break
                        }
                    }
                    continuation.resume(returning: bytes)
                }
            }
        }
    }

    /// The reader of standard error reads nothing until the pipe is full, then everything, four
    /// times over, while lines keep coming in batches four times the pipe's size; then it reads
    /// to the end while the access log writes what it holds. Every line that arrives is whole
    /// (none torn, none glued to the next) and arrives once, in order; every line that does not
    /// is counted as dropped.
    @Test func aStalledReaderGetsWholeLinesOnlyAndEveryLineItMissesIsCounted() async throws {
        let pipe = try StalledPipe()
        defer { close(pipe.readEnd) }
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let accessLog = AccessLog(format: .json, sink: FileDescriptorSink(descriptor: pipe.writeEnd), capacity: 4 * pipe.size)
        let logger = Self.logger()
        var received: [UInt8] = []
        var written = 0
        for _ in 0..<4 {
            written = try await group.next().submit { [written] in
                var number = written
                while !pipe.isFull, number < written + 10_000 {
                    accessLog.record(Self.line(number), logger: logger)
                    number += 1
                }
                // As many lines again as a full buffer holds: more than the buffer keeps.
                for _ in 0..<(4 * pipe.size / 150) {
                    accessLog.record(Self.line(number), logger: logger)
                    number += 1
                }
                return number
            }.get()
            #expect(pipe.isFull, "the reader waits for a full pipe")
            pipe.drain(into: &received)
        }
        async let rest = pipe.readToTheEnd()
        await accessLog.flush()
        close(pipe.writeEnd)
        received += await rest
        try await group.shutdownGracefully()

        #expect(received.last == UInt8(ascii: "\n"), "the last line ends")
        var numbers: [Int] = []
        for line in received.split(separator: UInt8(ascii: "\n")) {
            let object = try? JSONSerialization.jsonObject(with: Data(line)) as? [String: Any]
            let number = (object?["request_id"] as? String).flatMap { $0.wholeMatch(of: /r(\d+)/) }.flatMap { Int($0.1) }
            #expect(number != nil && object?["msg"] as? String == "request" && object?["status"] as? String == "200",
                    "a torn or glued line: \(String(decoding: line, as: UTF8.self))")
            if let number { numbers.append(number) }
        }
        #expect(numbers == numbers.sorted() && Set(numbers).count == numbers.count, "each line once, in order")
        #expect(accessLog.droppedLines > 0, "the stalls cost lines")
        #expect(accessLog.droppedLines == written - numbers.count, "\(written) written, \(numbers.count) received")
    }

    // MARK: Off

    @Test func offOrAboveInfoWritesNothing() async throws {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let sink = CapturedLines()
        let accessLog = AccessLog(format: .text, sink: sink)
        let off = accessLog.applying(.off)
        let quiet = Self.logger(level: .notice)
        try await group.next().submit {
            off.record(Self.fast, logger: Self.logger())
            accessLog.record(Self.fast, logger: quiet)
        }.get()
        off.record(Self.own, logger: Self.logger())
        accessLog.record(Self.own, logger: quiet)
        await accessLog.flush()
        try await Task.sleep(for: .milliseconds(50))
        #expect(sink.all.isEmpty)
        accessLog.applying(.on).record(Self.own, logger: Self.logger())
        #expect(sink.all.count == 1, "the same access log, on, writes")
        try await group.shutdownGracefully()
    }
}
