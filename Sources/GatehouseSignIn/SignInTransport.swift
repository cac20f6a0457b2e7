public import Foundation
#if canImport(FoundationNetworking)
public import FoundationNetworking
#endif

/// How the client reaches Gatehouse: one HTTP exchange. A transport throws only when there is no
/// answer at all; any HTTP status is an answer.
public protocol SignInTransport: Sendable {
    func send(_ request: URLRequest) async throws -> (Data, HTTPURLResponse)
}

/// The default transport: a URLSession (ephemeral by default: no cookies, no cache).
public struct URLSessionTransport: SignInTransport {
    public let session: URLSession

    public init(session: URLSession = URLSession(configuration: .ephemeral)) {
        self.session = session
    }

    public func send(_ request: URLRequest) async throws -> (Data, HTTPURLResponse) {
        let (data, response) = try await session.data(for: request)
        guard let http = response as? HTTPURLResponse else { throw URLError(.badServerResponse) }
        return (data, http)
    }
}
