import GatehouseCore

/// The life of one client connection at Gatehouse's edge, as a pure value: which timer runs
/// (head read, body read, keep-alive idle), how many requests are in flight, a request refused at the
/// connection level (answered once earlier answers are out, then the connection closes),
/// and `Expect: 100-continue`. `ConnectionEdgeHandler` carries out what it decides.
struct ConnectionEdgeStateMachine {
    enum Phase: Equatable {
        /// No request in flight and no byte of the next one yet: the idle timer runs.
        /// A new connection starts here, with the head timer instead (it owes a request).
        case idle
        /// Bytes of a request head are arriving: the head timer runs.
        case readingHead
        /// At least one request is in flight. While its body arrives the body timer runs
        /// between two parts (not while the app waits for `100 Continue`); then none (the
        /// route's timeout covers the backend).
        case busy
        /// A request was refused; the refusal is written once the answers before it are out.
        case rejecting(GatehouseProblem, instance: String)
        case closed
    }

    enum Action: Equatable {
        case none
        case armHeaderTimer
        case armIdleTimer
        case armBodyTimer
        case cancelTimer
        /// Write this problem with `Connection: close`, then close.
        case answerAndClose(GatehouseProblem, instance: String)
        case close
    }

    private(set) var phase: Phase = .readingHead
    /// Requests passed on whose answer has not ended.
    private(set) var inFlight = 0
    /// The one request in flight waits for `100 Continue` and has not had it.
    private var continuePending = false
    /// The request in flight has been read to its end.
    private var requestComplete = true

    /// Whether inbound parts go on to the relay and the router.
    var forwardsInbound: Bool {
        switch phase {
        case .rejecting, .closed: false
        default: true
        }
    }

    /// The connection opened: it owes a request head within the head timeout.
    mutating func opened() -> Action {
        phase = .readingHead
        return .armHeaderTimer
    }

    /// Bytes arrived from the client.
    mutating func bytesArrived() -> Action {
        guard phase == .idle else { return .none }
        phase = .readingHead
        return .armHeaderTimer
    }

    /// A whole request head arrived. `refusal` is a connection-level refusal of it (framing).
    mutating func headArrived(expectsContinue: Bool, refusal: (problem: GatehouseProblem, instance: String)?) -> Action {
        switch phase {
        case .rejecting, .closed:
            return .none
        case .idle, .readingHead, .busy:
            break
        }
        if let refusal {
            guard inFlight == 0 else {
                phase = .rejecting(refusal.problem, instance: refusal.instance)
                return .cancelTimer
            }
            phase = .closed
            return .answerAndClose(refusal.problem, instance: refusal.instance)
        }
        inFlight += 1
        phase = .busy
        requestComplete = false
        continuePending = expectsContinue && inFlight == 1
        return continuePending ? .cancelTimer : .armBodyTimer
    }

    /// A part of the request's body arrived: the body timer starts again.
    mutating func bodyPartArrived() -> Action {
        readingBody && phase == .busy ? .armBodyTimer : .none
    }

    /// The request's last part (`.end`) arrived.
    mutating func requestEnded() -> Action {
        requestComplete = true
        continuePending = false
        return phase == .busy ? .cancelTimer : .none
    }

    /// A request's body is being read: a parse error now belongs to that request (its reader
    /// must fail), not to a request of its own.
    var readingBody: Bool { inFlight > 0 && !requestComplete }

    /// Someone that will read the body asks for `100 Continue`: whether to write it now.
    mutating func continueRequested() -> Bool {
        guard continuePending, inFlight == 1, phase == .busy else { return false }
        continuePending = false
        return true
    }

    /// A final answer's head is being written: whether the connection must close after it
    /// (the app still waits for `100 Continue`, so its body may or may not follow).
    mutating func finalHeadWritten() -> Bool {
        guard inFlight == 1, continuePending, !requestComplete else { return false }
        continuePending = false
        return true
    }

    /// An answer ended.
    mutating func responseEnded() -> Action {
        inFlight = max(0, inFlight - 1)
        switch phase {
        case .rejecting(let problem, let instance) where inFlight == 0:
            phase = .closed
            return .answerAndClose(problem, instance: instance)
        case .busy where inFlight == 0:
            phase = .idle
            return .armIdleTimer
        default:
            return .none
        }
    }

    /// The head or idle timer fired.
    mutating func timerFired() -> Action {
        switch phase {
        case .idle, .readingHead:
            phase = .closed
            return .close
        case .busy where readingBody && !continuePending:
            // A body that stalls: the request cannot be completed, nor answered cleanly.
            phase = .closed
            return .close
        default:
            return .none
        }
    }
}
