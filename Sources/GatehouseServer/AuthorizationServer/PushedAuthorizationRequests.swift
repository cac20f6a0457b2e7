import Foundation
import GatehouseCore

/// Authorization requests recorded by Gatehouse itself and shown to `/oauth/authorize` as a
/// `request_uri` (RFC 9126 §4): the in-app sign-in's `redirect_to_web` hands one to the app, so
/// that the browser continues the very request the app began (its PKCE challenge, its state).
/// The request is kept sealed under its `request_uri`, keyed by the hash, for one use.
extension RecordingFeature {
    static var requestURIPrefix: String { "urn:ietf:params:oauth:request_uri:" }

    /// Records `parameters` (an authorization request, already checked) and returns its `request_uri`.
    func pushAuthorizationRequest(_ parameters: [(String, String)], lifetime: Duration) async throws -> String {
        let requestURI = Self.requestURIPrefix + SecureToken.generate()
        let query = FormParameters.encode(pairs: parameters)
        let sealed = try TokenSeal.seal(Data(query.utf8), with: requestURI, purpose: Self.pushedSealPurpose)
        try await store.insertTransaction(sealed: sealed, stateHash: Self.pushedKey(requestURI), expiresAt: expiry(after: lifetime))
        return requestURI
    }

    /// The query of the pushed request `requestURI`, consumed; `nil` when unknown, used or expired.
    func pullAuthorizationRequest(_ requestURI: String) async throws -> String? {
        guard requestURI.hasPrefix(Self.requestURIPrefix),
              let sealed = try await store.consumeTransaction(stateHash: Self.pushedKey(requestURI), now: now()),
              let query = try? TokenSeal.open(sealed, with: requestURI, purpose: Self.pushedSealPurpose) else { return nil }
        return String(decoding: query, as: UTF8.self)
    }

    private static var pushedSealPurpose: String { "gatehouse pushed-request v1" }

    private static func pushedKey(_ requestURI: String) -> String { "pushed." + SecureToken.hash(requestURI) }
}
