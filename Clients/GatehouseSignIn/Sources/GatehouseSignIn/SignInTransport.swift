public import Foundation
#if canImport(FoundationNetworking)
public import FoundationNetworking
#endif

/// How the client reaches Gatehouse: one HTTP exchange. A transport throws only when there is no
/// answer at all; any HTTP status is an answer.
public protocol SignInTransport: Sendable {
    func send(_ request: URLRequest) async throws -> (Data, HTTPURLResponse)
}

/// The default transport: an ephemeral URLSession (no cookies, no cache) that follows no
/// redirect, so that a form carrying a password is only ever posted to the endpoint it names.
public struct URLSessionTransport: SignInTransport {
    public let session: URLSession

    public init() {
        self.session = Self.shared
    }

    /// One session for every default transport: a session keeps its delegate until it is
    /// invalidated, so one per client would never be released.
    private static let shared = URLSession(configuration: .ephemeral, delegate: RefuseRedirects(), delegateQueue: nil)

    /// A session of the app's (its redirect policy is the session's).
    public init(session: URLSession) {
        self.session = session
    }

    public func send(_ request: URLRequest) async throws -> (Data, HTTPURLResponse) {
        let (data, response): (Data, URLResponse) = try await withCheckedThrowingContinuation { continuation in
            session.dataTask(with: request) { data, response, error in
                if let error {
                    continuation.resume(throwing: error)
                } else if let response {
                    continuation.resume(returning: (data ?? Data(), response))
                } else {
                    continuation.resume(throwing: URLError(.badServerResponse))
                }
            }.resume()
        }
        guard let http = response as? HTTPURLResponse else { throw URLError(.badServerResponse) }
        return (data, http)
    }
}

/// Answers every redirect with the redirect itself (the client sees a 3xx, an unexpected answer).
final class RefuseRedirects: NSObject, URLSessionTaskDelegate, Sendable {
    func urlSession(_ session: URLSession, task: URLSessionTask, willPerformHTTPRedirection response: HTTPURLResponse,
                    newRequest request: URLRequest, completionHandler: @escaping @Sendable (URLRequest?) -> Void) {
        completionHandler(nil)
    }
}
