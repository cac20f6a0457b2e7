import GatehouseCore
import Hummingbird
import Logging
import NIOCore

/// What every face does with requests and answers alike: bodies read within `server.max_body_bytes`,
/// forms as OAuth reads them, and the redirects back to the app.
extension GatehouseFeature {
    /// The whole body of a request to one of Gatehouse's own endpoints; `nil` when it is longer
    /// than `server.max_body_bytes` (the caller answers 413).
    func boundedBody(_ request: Request) async -> ByteBuffer? {
        var request = request
        return try? await request.collectBody(upTo: configuration.server.maximumBodyBytes)
    }

    /// 415 with an OAuth `invalid_request` unless the body is `application/x-www-form-urlencoded`
    /// (RFC 6749 §3.2, RFC 7009 §2.1).
    static func refusingNonFormBody(_ request: Request) -> Response? {
        guard !MediaType.matches(request.headers[.contentType], "application/x-www-form-urlencoded") else { return nil }
        var response = Response.oauthError(.invalidRequest("the body must be application/x-www-form-urlencoded"))
        response.status = .unsupportedMediaType
        return response
    }

    /// The form of an OAuth endpoint, read within the body limit.
    func oauthForm(_ request: Request, recognizing names: Set<String>, limits: FormParameters.Limits = .init()) async throws(OAuthError)
        -> FormParameters
    {
        guard let body = await boundedBody(request) else {
            throw .invalidRequest("the body is larger than \(configuration.server.maximumBodyBytes) bytes")
        }
        return try Self.oauthForm(body, recognizing: names, limits: limits)
    }

    /// The form of an OAuth endpoint in a body already read; a malformed one is `invalid_request`.
    static func oauthForm(_ body: ByteBuffer, recognizing names: Set<String>, limits: FormParameters.Limits = .init()) throws(OAuthError)
        -> FormParameters
    {
        do {
            return try FormParameters(parsing: body.readableBytesView, limits: limits, recognizing: names)
        } catch {
            throw .invalidRequest(error.description)
        }
    }

    /// The app's redirect URI with an error, its state and Gatehouse's issuer (RFC 6749 §4.1.2.1, RFC 9207).
    func appRedirect(_ redirectURI: String, error: OAuthError, state: String?) -> String {
        var parameters = [("error", error.code), ("error_description", error.detail)]
        if let state { parameters.append(("state", state)) }
        parameters.append(("iss", issuer))
        return RedirectURI.appending(parameters, to: redirectURI)
    }
}

extension RecordingFeature {
    /// Records a Gatehouse code for `issued` and sends the browser back to the app with it.
    func redirectWithCode(_ issued: IssuedCode, appState: String) async -> Response {
        let gatehouseCode: String
        do {
            gatehouseCode = try await recordCode(issued)
        } catch {
            logger.error("store failed to record a code", metadata: ["error": .string(String(describing: type(of: error)))])
            return .redirect(to: appRedirect(issued.redirectURI, error: .serverError("Gatehouse could not record the sign-in"), state: appState))
        }
        logger.info("code issued to app", metadata: ["client_id": .string(issued.clientID)])
        return .redirect(to: RedirectURI.appending([("code", gatehouseCode), ("state", appState), ("iss", issuer)], to: issued.redirectURI))
    }

    /// Records a fresh Gatehouse code for `issued` (its upstream tokens sealed under the code, kept
    /// by the code's hash, for `server.code_lifetime`) and returns it.
    func recordCode(_ issued: IssuedCode) async throws -> String {
        let code = SecureToken.generate()
        try await store.insertCode(sealed: try issued.sealed(with: code), codeHash: SecureToken.hash(code),
                                   expiresAt: expiry(after: configuration.server.codeLifetime))
        return code
    }
}
