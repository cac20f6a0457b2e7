import GatehouseCore
import Logging
import Metrics
import NIOCore
import NIOPosix
import Synchronization

/// The `request` lines, one per answered request (`observability.access_log`), written in
/// batches: on an event loop, a line is formatted straight into that loop's buffer, and the
/// buffer is written once the loop has run what it had to run, with one lock and one
/// `write(2)` for all the lines of that pass (nginx's `access_log … buffer=`). Writing each
/// line through swift-log instead had both event loops contend for the standard-error lock on
/// every request.
///
/// - The first line of a pass schedules the flush with `EventLoop.execute`: it runs after the
///   I/O and the tasks already queued, before the loop waits again; but a loop writes at most
///   once every `writeInterval` (1 ms), so a flush due sooner is scheduled for then. An idle
///   gateway writes each line at once; under load a write carries the lines of many passes.
/// - A buffer that reaches `capacity` is written at once.
/// - The sink is the standard-error sink the other loggers write through, under its lock: a
///   batch holds whole lines only and never lands inside another logger's line.
/// - Off an event loop (a task on Swift's own executor) the line is written at once, alone.
/// - At shutdown, `flush()` writes what every loop still holds (nothing, once its pass ended).
/// - Standard error may refuse lines (a pipe made non-blocking elsewhere whose reader falls
///   behind: `EAGAIN`; or a failed write). A line begun is finished before any other starts
///   (`LogLineWriter`: the loop waits at most `LogLineWriter.tornLinePatience` for its end,
///   which is otherwise written first next time); the loop never waits for whole lines: those
///   not taken stay in the buffer and are tried again `retryInterval` later, up to half the
///   `capacity`. Past it the oldest are dropped, whole, and counted
///   (`gatehouse_access_log_lines_dropped_total`, `droppedLines`).
///
/// What a crash can lose: the lines of the pass each loop was running and of the last
/// millisecond, at most `capacity` bytes a loop. A SIGTERM loses nothing, unless standard error
/// takes nothing for `shutdownPatience` (those lines are counted as dropped).
///
/// Lines are written at `info`: a logger above it (`--log-level notice`) writes none.
public final class AccessLog: Sendable {
    enum Output: Sendable {
        /// No line at all (`access_log: off`).
        case off
        /// Through the logger, as any other line (in-process tests, where swift-log is not Gatehouse's).
        case logger
        /// Formatted here, buffered per event loop.
        case batched(RequestLineFormatter, any LogLineSink)
    }

    let output: Output
    /// Bytes a loop's buffer may hold before it is written at once.
    let capacity: Int
    /// The shortest time between two writes of one loop's buffer (but past `capacity`).
    static let writeInterval = TimeAmount.milliseconds(1)
    /// The buffer of the event loop of the current thread.
    private let buffers = ThreadSpecificVariable<LoopBuffer>()
    /// Every loop's buffer, for `flush()`.
    private let allBuffers = Mutex<[LoopBuffer]>([])
    /// How long a loop waits before it tries again lines standard error did not take.
    static let retryInterval = TimeAmount.milliseconds(10)
    /// How long `flush()` waits for standard error to take the last lines.
    static let shutdownPatience = Duration.seconds(1)
    private let dropped = Atomic<Int>(0)

    /// Lines dropped, whole, because standard error did not take them (also counted in
    /// `gatehouse_access_log_lines_dropped_total`).
    var droppedLines: Int { dropped.load(ordering: .relaxed) }

    init(output: Output, capacity: Int = 64 * 1024) {
        self.output = output
        self.capacity = capacity
    }

    /// Lines written through the logger they are given, as any other line (Gatehouse's handlers
    /// are not set up: in-process tests).
    public static let throughLogger = AccessLog(output: .logger)

    /// No line (`observability.access_log: off`).
    public static let off = AccessLog(output: .off)

    /// This access log as `observability.access_log` says: itself when `on`, none when `off`.
    func applying(_ setting: AccessLogSetting) -> AccessLog {
        setting == .on ? self : .off
    }

    /// Lines in `format` to `sink` (standard error's, whose lock the other loggers take).
    convenience init(format: LogFormat, sink: any LogLineSink, capacity: Int = 64 * 1024) {
        self.init(output: .batched(RequestLineFormatter(format: format), sink), capacity: capacity)
    }

    /// Writes the line of an answered request when `logger` lets `info` through. `extra`: what
    /// the logger's own metadata and its metadata provider add on the general path (`trace_id`,
    /// `span_id`); the fast path runs outside any task or span and has nothing to add.
    func record(_ line: RequestLine, logger: Logger, extra: @autoclosure () -> Logger.Metadata = [:]) {
        guard logger.logLevel <= .info else { return }
        switch output {
        case .off:
            return
        case .logger:
            logger.info("request", metadata: line.metadata)
        case .batched(let formatter, let sink):
            guard let eventLoop = MultiThreadedEventLoopGroup.currentEventLoop else {
                var clock = LogClock()
                var bytes: [UInt8] = []
                bytes.reserveCapacity(256)
                formatter.append(line, label: logger.label, extra: extra(), clock: &clock, to: &bytes)
                if sink.write(bytes, patience: .zero) < bytes.count { countDropped(1) }
                return
            }
            let buffer = buffer(on: eventLoop)
            formatter.append(line, label: logger.label, extra: extra(), clock: &buffer.clock, to: &buffer.bytes)
            if buffer.bytes.count >= capacity {
                write(buffer, to: sink)
            } else if !buffer.flushScheduled {
                // At most one write a millisecond: a loop that wrote moments ago waits out the
                // rest of it, gathering the lines of the passes in between.
                scheduleWrite(of: buffer, to: sink, at: buffer.lastWrite + Self.writeInterval)
            }
        }
    }

    /// Writes `buffer` at `due` (on its loop's next pass if due already).
    private func scheduleWrite(of buffer: LoopBuffer, to sink: any LogLineSink, at due: NIODeadline) {
        buffer.flushScheduled = true
        let write: @Sendable () -> Void = {
            buffer.flushScheduled = false
            self.write(buffer, to: sink)
        }
        if due <= .now() {
            buffer.eventLoop.execute(write)
        } else {
            buffer.eventLoop.scheduleTask(deadline: due, write)
        }
    }

    /// Hands the buffered lines to `sink`, without waiting for it. What it does not take is
    /// kept, up to half the capacity (the oldest lines past it dropped and counted), and tried
    /// again `retryInterval` later. On `buffer`'s loop.
    private func write(_ buffer: LoopBuffer, to sink: any LogLineSink) {
        guard !buffer.write(to: sink, patience: .zero) else { return }
        countDropped(buffer.dropOldestLines(keepingAtMost: capacity / 2))
        if !buffer.flushScheduled { scheduleWrite(of: buffer, to: sink, at: .now() + Self.retryInterval) }
    }

    private func countDropped(_ lines: Int) {
        guard lines > 0 else { return }
        dropped.add(lines, ordering: .relaxed)
        AccessLogMetrics.droppedLines.increment(by: Int64(lines))
    }

    /// The general path's `extra`: the logger's own metadata, then its provider's.
    static func extra(of logger: Logger) -> Logger.Metadata {
        var extra = logger.handler.metadata
        if let provided = logger.metadataProvider?.get(), !provided.isEmpty {
            extra.merge(provided) { _, provided in provided }
        }
        return extra
    }

    /// Writes what every event loop's buffer holds, on that loop; returns once all are written.
    /// For the end of a graceful shutdown, after the last request.
    public func flush() async {
        guard case .batched(_, let sink) = output else { return }
        for buffer in allBuffers.withLock({ $0 }) {
            try? await buffer.eventLoop.submit {
                // The last chance: what standard error does not take within its patience is dropped.
                if !buffer.write(to: sink, patience: Self.shutdownPatience) {
                    self.countDropped(buffer.dropOldestLines(keepingAtMost: 0))
                }
            }.get()
        }
    }

    /// The current thread's buffer, made on the first line of `eventLoop`.
    private func buffer(on eventLoop: any EventLoop) -> LoopBuffer {
        if let buffer = buffers.currentValue { return buffer }
        let buffer = LoopBuffer(eventLoop: eventLoop, capacity: capacity)
        buffers.currentValue = buffer
        allBuffers.withLock { $0.append(buffer) }
        return buffer
    }
}

/// One event loop's pending lines.
///
/// `@unchecked Sendable`: only its loop's thread touches `bytes`, `flushScheduled` and
/// `clock`: through that thread's `ThreadSpecificVariable`, or in a task run on that loop
/// (the scheduled flush, `AccessLog.flush()`). Other threads only hold the reference.
private final class LoopBuffer: @unchecked Sendable {
    let eventLoop: any EventLoop
    var bytes: [UInt8] = []
    var flushScheduled = false
    var clock = LogClock()
    /// When the buffer was last written.
    var lastWrite = NIODeadline.distantPast

    init(eventLoop: any EventLoop, capacity: Int) {
        self.eventLoop = eventLoop
        bytes.reserveCapacity(capacity + 1024)
    }

    /// Hands the buffered lines to `sink` in one call (with none, the end of a line it began
    /// before), and removes what it took; whether it took them all.
    func write(to sink: any LogLineSink, patience: Duration) -> Bool {
        let taken = sink.write(bytes, patience: patience)
        lastWrite = .now()
        guard taken == bytes.count else {
            bytes.removeFirst(taken)
            return false
        }
        bytes.removeAll(keepingCapacity: true)
        return true
    }

    /// Drops the oldest whole lines until at most `limit` bytes are left; how many it dropped.
    func dropOldestLines(keepingAtMost limit: Int) -> Int {
        guard bytes.count > limit else { return 0 }
        let newline = UInt8(ascii: "\n")
        var cut = bytes.count - limit
        if bytes[cut - 1] != newline {
            // Up to the end of the line the cut falls in.
            cut = bytes[cut...].firstIndex(of: newline).map { $0 + 1 } ?? bytes.count
        }
        let lines = bytes[..<cut].count(where: { $0 == newline })
        bytes.removeFirst(cut)
        return lines
    }
}

/// `gatehouse_access_log_lines_dropped_total`, made at the first drop (after `serve` has set the
/// metrics system up) and kept.
private enum AccessLogMetrics {
    static let droppedLines = Counter(label: GatehouseMetrics.accessLogLinesDroppedTotal)
}
