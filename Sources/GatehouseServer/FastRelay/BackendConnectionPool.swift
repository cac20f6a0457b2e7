import GatehouseRelay
import Logging
import NIOCore
import NIOHTTP1
import NIOPosix

/// Where the fast path gets backend connections (the pool below; a stand-in in tests).
protocol BackendConnecting: Sendable {
    /// An idle connection to `backend` on `eventLoop`, if there is one (no future, no allocation).
    func idleConnection(to backend: RouteBackend, on eventLoop: any EventLoop) -> BackendConnection?
    /// An idle connection to `backend` on `eventLoop`, or a new one. `reused` says which.
    func connection(to backend: RouteBackend, on eventLoop: any EventLoop) -> EventLoopFuture<(BackendConnection, reused: Bool)>
    /// A new connection.
    func connect(to backend: RouteBackend, on eventLoop: any EventLoop) -> EventLoopFuture<BackendConnection>
}

/// Keep-alive connections to backends, one pool per event loop: a request is relayed on a
/// connection of the loop that serves its client, so the whole exchange stays on one thread.
final class BackendConnectionPool: BackendConnecting {
    private let loops: [ObjectIdentifier: LoopPool]
    let connectTimeout: TimeAmount

    init(group: any EventLoopGroup, connectTimeout: TimeAmount, maximumIdlePerBackend: Int = 256) {
        var loops: [ObjectIdentifier: LoopPool] = [:]
        for loop in group.makeIterator() {
            loops[ObjectIdentifier(loop)] = LoopPool(eventLoop: loop, maximumIdle: maximumIdlePerBackend)
        }
        self.loops = loops
        self.connectTimeout = connectTimeout
    }

    /// An idle connection to `backend` on `eventLoop`, if there is one (no future, no allocation).
    func idleConnection(to backend: RouteBackend, on eventLoop: any EventLoop) -> BackendConnection? {
        loops[ObjectIdentifier(eventLoop)]?.takeIdle(backend.key)
    }

    /// An idle connection to `backend` on `eventLoop`, or a new one. `reused` says which.
    func connection(to backend: RouteBackend, on eventLoop: any EventLoop) -> EventLoopFuture<(BackendConnection, reused: Bool)> {
        guard let pool = loops[ObjectIdentifier(eventLoop)] else {
            return eventLoop.makeFailedFuture(ChannelError.ioOnClosedChannel)
        }
        if let idle = pool.takeIdle(backend.key) {
            return eventLoop.makeSucceededFuture((idle, reused: true))
        }
        return connect(to: backend, pool: pool).map { ($0, reused: false) }
    }

    func connect(to backend: RouteBackend, on eventLoop: any EventLoop) -> EventLoopFuture<BackendConnection> {
        guard let pool = loops[ObjectIdentifier(eventLoop)] else {
            return eventLoop.makeFailedFuture(ChannelError.ioOnClosedChannel)
        }
        return connect(to: backend, pool: pool)
    }

    private func connect(to backend: RouteBackend, pool: LoopPool) -> EventLoopFuture<BackendConnection> {
        let key = backend.key
        return ClientBootstrap(group: pool.eventLoop)
            .connectTimeout(connectTimeout)
            .channelOption(.socketOption(.tcp_nodelay), value: 1)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHTTPClientHandlers()
                    let handler = BackendExchangeHandler(pool: pool, key: key)
                    try channel.pipeline.syncOperations.addHandler(handler)
                }
            }
            .connect(host: backend.host, port: backend.port)
            .flatMapThrowing { channel in
                BackendConnection(channel: channel, handler: try channel.pipeline.syncOperations.handler(type: BackendExchangeHandler.self))
            }
    }
}

/// One event loop's idle connections. Touched only on that loop, hence the unchecked Sendable.
final class LoopPool: @unchecked Sendable {
    let eventLoop: any EventLoop
    let maximumIdle: Int
    private var idle: [String: [BackendConnection]] = [:]

    init(eventLoop: any EventLoop, maximumIdle: Int) {
        self.eventLoop = eventLoop
        self.maximumIdle = maximumIdle
    }

    func takeIdle(_ key: String) -> BackendConnection? {
        eventLoop.assertInEventLoop()
        while let connection = idle[key]?.popLast() {
            if connection.channel.isActive { return connection }
        }
        return nil
    }

    func giveBack(_ connection: BackendConnection, key: String) {
        eventLoop.assertInEventLoop()
        guard connection.channel.isActive, (idle[key]?.count ?? 0) < maximumIdle else {
            connection.channel.close(promise: nil)
            return
        }
        idle[key, default: []].append(connection)
    }

    func forget(_ channel: any Channel, key: String) {
        eventLoop.assertInEventLoop()
        idle[key]?.removeAll { $0.channel === channel }
    }
}

/// A connection to a backend and the handler that runs exchanges on it. Used only on the
/// connection's event loop (futures carry it there), hence the unchecked Sendable.
struct BackendConnection: @unchecked Sendable {
    let channel: any Channel
    let handler: BackendExchangeHandler
}
