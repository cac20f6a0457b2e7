import NIOCore

/// A timeout whose deadline moves often (on every request, or every part of a body) over one
/// scheduled task that moves rarely: cancelling and scheduling a task per request costs a heap
/// operation on the event loop each time, measured at several per cent of the relay's
/// throughput. The task fires at its time and then either calls `onExpiry` (the deadline has
/// passed) or sleeps on to the deadline that replaced it. Used only on `eventLoop`.
final class LazyTimer {
    private let eventLoop: any EventLoop
    private var deadline: NIODeadline?
    private var scheduled: Scheduled<Void>?
    private var scheduledAt: NIODeadline?
    /// Called on the event loop once the deadline has passed (set it once; capture weakly).
    var onExpiry: (() -> Void)?

    init(eventLoop: any EventLoop) {
        self.eventLoop = eventLoop
    }

    /// The deadline is now `timeout` from now, replacing any other.
    func arm(in timeout: TimeAmount) {
        let when = eventLoop.now + timeout
        deadline = when
        if let scheduledAt, scheduledAt <= when { return }  // it fires first, then sleeps on to `when`
        scheduled?.cancel()
        schedule(at: when)
    }

    /// No deadline runs (the scheduled task, if any, will find none and do nothing).
    func disarm() {
        deadline = nil
    }

    /// Cancels everything, for a connection that has gone.
    func stop() {
        scheduled?.cancel()
        scheduled = nil
        scheduledAt = nil
        deadline = nil
    }

    private func schedule(at when: NIODeadline) {
        scheduledAt = when
        scheduled = eventLoop.assumeIsolated().scheduleTask(deadline: when) { [weak self] in
            guard let self else { return }
            self.scheduled = nil
            self.scheduledAt = nil
            guard let deadline = self.deadline else { return }
            if deadline > self.eventLoop.now { return self.schedule(at: deadline) }
            self.deadline = nil
            self.onExpiry?()
        }
    }
}
