public import AsyncHTTPClient
import Foundation
import NIOHTTP1
public import GatehouseCore
import NIOCore

/// A legacy personal-information service (myVOO's `GetPersonalInformation`): sent the
/// access token, it answers who holds it, in JSON or XML. 200 is an identity; 401 or 403
/// means the token is dead; anything else means the service could not say.
public struct PersonalInformationResolver: IdentityResolver {
    let settings: IdentitySettings
    let http: IdentityHTTP
    let extraction: IdentityExtraction

    /// - Parameters:
    ///   - upstream: the upstream whose identity service this is (metrics, spans).
    ///   - concurrency: calls in flight at most toward the service (`identity_concurrency`).
    public init(settings: IdentitySettings, upstream: String, client: HTTPClient, concurrency: Int) {
        self.init(settings: settings, http: IdentityHTTP(upstream: upstream, timeout: settings.timeout, concurrency: concurrency, client: client))
    }

    init(settings: IdentitySettings, http: IdentityHTTP) {
        self.settings = settings
        self.http = http
        self.extraction = IdentityExtraction(settings: settings, defaultSubjectPaths: [])
    }

    public func resolve(token: String) async throws(IdentityUnavailable) -> IdentityResolution {
        var url = settings.url
        var request = HTTPClientRequest(url: url)
        request.method = .init(rawValue: settings.method)
        request.headers.add(name: "Accept", value: settings.format == .xml ? "application/xml, text/xml" : "application/json")
        switch settings.tokenPlacement {
        case .bearer:
            request.headers.add(name: "Authorization", value: "Bearer \(token)")
        case .query(let name):
            url = RedirectURI.appending([(name, token)], to: url)
            request.url = url
        case .form(let name):
            request.headers.add(name: "Content-Type", value: "application/x-www-form-urlencoded")
            request.body = .bytes(ByteBuffer(string: "\(FormParameters.encode(name))=\(FormParameters.encode(token))"))
        }
        let (status, body) = try await http.send(request)
        switch status {
        case 200:
            if settings.format == .xml {
                guard let identity = extraction.identity(fromXML: body) else {
                    throw IdentityUnavailable(.badResponse, "the personal-information service's answer is not well-formed XML")
                }
                return .active(identity)
            }
            return .active(extraction.identity(fromJSON: try IdentityHTTP.json(body), expiresAt: nil))
        case 401, 403:
            return .inactive
        default:
            throw IdentityUnavailable(.badResponse, "the personal-information service answered HTTP \(status)")
        }
    }
}
