#if canImport(Glibc)
@preconcurrency import Glibc
#elseif canImport(Musl)
@preconcurrency import Musl
#elseif canImport(Darwin)
@preconcurrency import Darwin
#endif

/// Writes whole log lines to a descriptor that may refuse them for a while: standard error may
/// be a pipe that another process made non-blocking (`EAGAIN` once its reader falls behind), or
/// fail outright (`EPIPE`, `ENOSPC`).
///
/// - No line ever starts inside another: when the descriptor takes only the start of a line,
///   its end is waited for a few milliseconds (`poll(2)`), then kept (`unfinished`) and written
///   before anything else on the next call. The reader may see a line late, never torn or
///   glued to the next one.
/// - `EINTR` is retried; `EAGAIN` waits for the descriptor at most the caller's `patience`
///   (zero on an event loop: it is never held up for the whole lines it hands over).
/// - What is not taken is whole lines, for the caller to keep for later or drop and count.
///
/// A value to keep under its sink's lock: one writer per descriptor.
struct LogLineWriter {
    let descriptor: Int32
    /// The end of the last line of which only the start was written.
    private(set) var unfinished: [UInt8] = []

    /// How long a call that wrote the start of a line waits to write its end.
    static let tornLinePatience = Duration.milliseconds(5)

    private static let newline = UInt8(ascii: "\n")

    init(descriptor: Int32) {
        self.descriptor = descriptor
    }

    /// Writes `lines` (whole lines, each ended by `\n`; empty: only the unfinished line's end),
    /// waiting at most `patience` while the descriptor takes nothing. Returns how many bytes of
    /// `lines` it took: written, or begun and to be finished by a later call. The bytes after
    /// them are whole lines that were not written.
    mutating func write(_ lines: [UInt8], patience: Duration) -> Int {
        let deadline = ContinuousClock.now + patience
        if !unfinished.isEmpty {
            let written = Self.write(unfinished[...], to: descriptor, until: deadline)
            unfinished.removeFirst(written)
            guard unfinished.isEmpty else { return 0 }
        }
        let written = Self.write(lines[...], to: descriptor, until: deadline)
        guard written < lines.count, written > 0, lines[written - 1] != Self.newline else { return written }
        // A line was begun: its end must come before any other line.
        let end = lines[written...].firstIndex(of: Self.newline).map { $0 + 1 } ?? lines.count
        let rest = lines[written..<end]
        let finished = Self.write(rest, to: descriptor, until: max(deadline, ContinuousClock.now + Self.tornLinePatience))
        if finished < rest.count { unfinished = Array(rest.dropFirst(finished)) }
        return end
    }

    /// `write(2)` of `bytes` until all are written, the descriptor fails, or it takes nothing
    /// until `deadline`; how many bytes were written.
    private static func write(_ bytes: ArraySlice<UInt8>, to descriptor: Int32, until deadline: ContinuousClock.Instant) -> Int {
        bytes.withUnsafeBytes { buffer in
            guard let base = buffer.baseAddress else { return 0 }
            var offset = 0
            while offset < buffer.count {
                let written = writeBytes(descriptor, base + offset, buffer.count - offset)
                if written > 0 {
                    offset += written
                    continue
                }
                guard written < 0 else { break }
                let error = errno
                if error == EINTR { continue }
                guard error == EAGAIN || error == EWOULDBLOCK, waitUntilWritable(descriptor, until: deadline) else { break }
            }
            return offset
        }
    }

    /// Waits until `descriptor` takes bytes again (true), or `deadline` passes.
    private static func waitUntilWritable(_ descriptor: Int32, until deadline: ContinuousClock.Instant) -> Bool {
        while true {
            let left = deadline - ContinuousClock.now
            guard left > .zero else { return false }
            let (seconds, attoseconds) = left.components
            let milliseconds = Int32(clamping: seconds * 1000 + (attoseconds + 999_999_999_999_999) / 1_000_000_000_000_000)
            var descriptors = pollfd(fd: descriptor, events: Int16(POLLOUT), revents: 0)
            let ready = pollDescriptors(&descriptors, 1, milliseconds)
            if ready > 0 { return true }  // writable, or failed: the next write says which
            if ready < 0, errno != EINTR { return false }
            // Timed out (the loop sees whether the deadline passed) or interrupted.
        }
    }
}

/// `write(2)`, named apart from `LogLineSink.write`.
private func writeBytes(_ descriptor: Int32, _ bytes: UnsafeRawPointer, _ count: Int) -> Int {
    write(descriptor, bytes, count)
}

/// `poll(2)`.
private func pollDescriptors(_ descriptors: UnsafeMutablePointer<pollfd>, _ count: Int, _ milliseconds: Int32) -> Int32 {
    poll(descriptors, nfds_t(count), milliseconds)
}
