import GatehouseRelay
import Logging
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL

/// Where the fast path gets backend connections (the pool below; a stand-in in tests).
protocol BackendConnecting: Sendable {
    /// The most recently used idle connection to `target`'s backend on `eventLoop`, if there is one
    /// that has been idle for at most `idleAtMost` (no future, no allocation).
    func idleConnection(to target: FastRoute, on eventLoop: any EventLoop, idleAtMost: TimeAmount) -> BackendConnection?
    /// A new connection (TLS when the backend is https).
    func connect(to target: FastRoute, on eventLoop: any EventLoop) -> EventLoopFuture<BackendConnection>
}

/// Keep-alive connections to backends, one pool per event loop: a request is relayed on a
/// connection of the loop that serves its client, so the whole exchange stays on one thread.
/// No timer runs per request or per connection: each loop's pool has one repeated sweep that
/// closes connections idle longer than `idleTimeout`, and a request that may not be sent twice
/// takes only a connection used moments ago (a backend closing an idle connection is a race
/// such a request must not lose).
final class BackendConnectionPool: BackendConnecting {
    /// A connection idle longer than this is closed by the sweep (below common backends' own
    /// keep-alive timeouts would be better still: Node's is 5 s, nginx's 75 s).
    static let idleTimeout = TimeAmount.seconds(30)
    /// The longest a connection may have been idle for a request that is never sent twice.
    static let freshForUnsafeMethods = TimeAmount.seconds(1)

    private let loops: [ObjectIdentifier: LoopPool]
    let connectTimeout: TimeAmount

    init(group: any EventLoopGroup, connectTimeout: TimeAmount, maximumIdlePerBackend: Int = 256) {
        var loops: [ObjectIdentifier: LoopPool] = [:]
        for loop in group.makeIterator() {
            loops[ObjectIdentifier(loop)] = LoopPool(eventLoop: loop, maximumIdle: maximumIdlePerBackend, idleTimeout: Self.idleTimeout)
        }
        self.loops = loops
        self.connectTimeout = connectTimeout
    }

    func idleConnection(to target: FastRoute, on eventLoop: any EventLoop, idleAtMost: TimeAmount) -> BackendConnection? {
        loops[ObjectIdentifier(eventLoop)]?.takeIdle(target.poolKey, idleAtMost: idleAtMost)
    }

    func connect(to target: FastRoute, on eventLoop: any EventLoop) -> EventLoopFuture<BackendConnection> {
        guard let pool = loops[ObjectIdentifier(eventLoop)] else {
            return eventLoop.makeFailedFuture(ChannelError.ioOnClosedChannel)
        }
        let key = target.poolKey
        let tls = target.tls
        return ClientBootstrap(group: pool.eventLoop)
            .connectTimeout(connectTimeout)
            .channelOption(.socketOption(.tcp_nodelay), value: 1)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    let operations = channel.pipeline.syncOperations
                    if let tls, let context = tls.context {
                        try operations.addHandler(try NIOSSLClientHandler(context: context, serverHostname: tls.serverHostname))
                    }
                    // Every header of a fast request is already checked: the app's by NIO's parser,
                    // identity values by `RelayHeaderPolicy.headerSafe`, a sealed session's upstream
                    // token by the planner, the rest made by Gatehouse. A second pass cost ~2 %.
                    try operations.addHTTPClientHandlers(enableOutboundHeaderValidation: false)
                    try operations.addHandler(BackendExchangeHandler(pool: pool, key: key))
                }
            }
            .connect(host: target.backend.host, port: target.backend.port)
            .flatMapThrowing { channel in
                BackendConnection(channel: channel, handler: try channel.pipeline.syncOperations.handler(type: BackendExchangeHandler.self))
            }
    }
}

/// One event loop's idle connections. Touched only on that loop, hence the unchecked Sendable.
final class LoopPool: @unchecked Sendable {
    private struct Idle {
        let connection: BackendConnection
        let since: NIODeadline
    }

    let eventLoop: any EventLoop
    let maximumIdle: Int
    let idleTimeout: TimeAmount
    /// Per backend, oldest first: a request takes the most recently used one.
    private var idle: [String: [Idle]] = [:]
    private var sweep: RepeatedTask?

    init(eventLoop: any EventLoop, maximumIdle: Int, idleTimeout: TimeAmount) {
        self.eventLoop = eventLoop
        self.maximumIdle = maximumIdle
        self.idleTimeout = idleTimeout
    }

    func takeIdle(_ key: String, idleAtMost: TimeAmount) -> BackendConnection? {
        eventLoop.assertInEventLoop()
        guard let newest = idle[key]?.last else { return nil }
        guard newest.since >= eventLoop.now - idleAtMost else { return nil }
        idle[key]!.removeLast()
        guard newest.connection.channel.isActive else { return takeIdle(key, idleAtMost: idleAtMost) }
        return newest.connection
    }

    func giveBack(_ connection: BackendConnection, key: String) {
        eventLoop.assertInEventLoop()
        guard connection.channel.isActive, (idle[key]?.count ?? 0) < maximumIdle else {
            connection.channel.close(promise: nil)
            return
        }
        idle[key, default: []].append(Idle(connection: connection, since: eventLoop.now))
        if sweep == nil { startSweeping() }
    }

    func forget(_ channel: any Channel, key: String) {
        eventLoop.assertInEventLoop()
        idle[key]?.removeAll { $0.connection.channel === channel }
    }

    /// One task per loop, every half `idleTimeout`: closes the connections idle longer than it.
    private func startSweeping() {
        let interval = TimeAmount.nanoseconds(idleTimeout.nanoseconds / 2)
        sweep = eventLoop.scheduleRepeatedTask(initialDelay: interval, delay: interval) { [weak self] task in
            guard let self else { return task.cancel() }
            self.closeStale()
        }
    }

    private func closeStale() {
        let oldest = eventLoop.now - idleTimeout
        for key in Array(idle.keys) {
            guard let entries = idle[key], let first = entries.first, first.since < oldest else { continue }
            let stale = entries.prefix { $0.since < oldest }
            idle[key] = Array(entries.dropFirst(stale.count))
            for entry in stale { entry.connection.channel.close(promise: nil) }
        }
    }
}

/// A connection to a backend and the handler that runs exchanges on it. Used only on the
/// connection's event loop (futures carry it there), hence the unchecked Sendable.
struct BackendConnection: @unchecked Sendable {
    let channel: any Channel
    let handler: BackendExchangeHandler
}
