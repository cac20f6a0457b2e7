import GatehouseCore
import Logging
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
///
/// What a crash can lose: the lines of the pass each loop was running and of the last
/// millisecond, at most `capacity`
/// bytes a loop. A SIGTERM loses nothing.
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
                return sink.write(bytes)
            }
            let buffer = buffer(on: eventLoop)
            formatter.append(line, label: logger.label, extra: extra(), clock: &buffer.clock, to: &buffer.bytes)
            if buffer.bytes.count >= capacity {
                buffer.write(to: sink)
            } else if !buffer.flushScheduled {
                buffer.flushScheduled = true
                let flush: @Sendable () -> Void = {
                    buffer.flushScheduled = false
                    buffer.write(to: sink)
                }
                // At most one write a millisecond: a loop that wrote moments ago waits out the
                // rest of it, gathering the lines of the passes in between.
                let due = buffer.lastWrite + Self.writeInterval
                if due <= .now() {
                    eventLoop.execute(flush)
                } else {
                    eventLoop.scheduleTask(deadline: due, flush)
                }
            }
        }
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
            try? await buffer.eventLoop.submit { buffer.write(to: sink) }.get()
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

    /// Hands the buffered lines to `sink` in one call, then empties the buffer (keeping its storage).
    func write(to sink: any LogLineSink) {
        guard !bytes.isEmpty else { return }
        sink.write(bytes)
        bytes.removeAll(keepingCapacity: true)
        lastWrite = .now()
    }
}
