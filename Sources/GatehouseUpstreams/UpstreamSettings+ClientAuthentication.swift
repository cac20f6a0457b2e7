public import AsyncHTTPClient
public import Foundation
public import GatehouseCore
import NIOCore
import NIOHTTP1
public import NIOSSL

// How Gatehouse proves itself to an upstream, in one place: every request that carries client
// authentication (token, refresh, revocation, a pushed authorization request) is made by
// `authenticatedForm`, and every connection to the upstream by `tlsConfiguration`.

extension UpstreamSettings {
    /// A form POST to one of this upstream's endpoints carrying Gatehouse's client authentication
    /// the way `client_auth` says: a secret (RFC 6749 §2.3.1), a signed assertion (RFC 7523 §2.2),
    /// or, for the mutual-TLS methods, `client_id` alone, the certificate going on the connection
    /// (RFC 8705 §2). An assertion's `aud` is decided here from `url`, the URL it is posted to
    /// (`assertionAudience(postedTo:tokenEndpoint:)`), so no caller can name another endpoint.
    /// `tokenEndpoint`: the upstream's token endpoint (`nil` when not known).
    public func authenticatedForm(url: String, _ parameters: [(String, String)], tokenEndpoint: String?, now: Date = Date())
        throws(OAuthError) -> HTTPClientRequest
    {
        let audience = assertionAudience(postedTo: url, tokenEndpoint: tokenEndpoint)
        var form = parameters
        var request = HTTPClientRequest(url: url)
        request.method = .POST
        request.headers.add(name: "Content-Type", value: "application/x-www-form-urlencoded")
        request.headers.add(name: "Accept", value: "application/json")
        // A pushed authorization request names the client already.
        let namesClient = form.contains { $0.0 == "client_id" }
        switch clientAuthentication {
        case .clientSecretBasic:
            // Both parts are form-encoded before they are joined.
            let pair = FormParameters.encode(clientID) + ":" + FormParameters.encode(clientSecret.reveal())
            request.headers.add(name: "Authorization", value: "Basic " + Data(pair.utf8).base64EncodedString())
        case .clientSecretPost:
            if !namesClient { form.append(("client_id", clientID)) }
            form.append(("client_secret", clientSecret.reveal()))
        case .privateKeyJWT:
            if !namesClient { form.append(("client_id", clientID)) }
            form.append(("client_assertion_type", ClientAssertion.type))
            do {
                // The configuration decoder never makes private_key_jwt settings without keys.
                guard let assertion = clientAssertion else { throw ClientAssertion.NoKey() }
                form.append(("client_assertion", try ClientAssertion.sign(clientID: clientID, audience: audience, settings: assertion, now: now)))
            } catch {
                // Signing with a key the configuration read cannot fail short of memory; nothing is sent.
                throw OAuthError.serverError("Gatehouse could not sign its client assertion").delivered(.notUpstream)
            }
        case .tlsClientAuth, .selfSignedTLSClientAuth:
            if !namesClient { form.append(("client_id", clientID)) }
        }
        request.body = .bytes(ByteBuffer(string: FormParameters.encode(pairs: form)))
        return request
    }

    /// The `aud` of this upstream's client assertion posted to `url`: its issuer (`issuer`, the
    /// default; an upstream without one, a plain OAuth 2.0 server, names each endpoint by its URL),
    /// the endpoint's URL (`endpoint`; `token_endpoint`, which names the token endpoint there only),
    /// or the URL configured; never the token endpoint's URL at another endpoint
    /// (`ClientAssertionAudience.audience(postedTo:tokenEndpoint:issuer:)`).
    public func assertionAudience(postedTo url: String, tokenEndpoint: String?) -> String {
        (clientAssertion?.audience ?? .issuer).audience(postedTo: url, tokenEndpoint: tokenEndpoint, issuer: profile.issuerIdentifier)
    }

    /// The TLS settings of every connection to this upstream: its `ca_file` trusted besides the
    /// system's roots (so a host of the upstream's with a public certificate, a CDN serving its keys,
    /// still verifies), and the client certificate of the mutual-TLS methods; `nil` when neither
    /// is configured. The configuration loader builds it once, so a file NIOSSL cannot read is a
    /// configuration problem.
    public func tlsConfiguration() throws -> TLSConfiguration? {
        guard trustRootsPEM != nil || clientCertificate != nil else { return nil }
        var tls = TLSConfiguration.makeClientConfiguration()
        if let pem = trustRootsPEM {
            tls.additionalTrustRoots = [.certificates(try NIOSSLCertificate.fromPEMBytes(Array(pem.utf8)))]
        }
        if let certificate = clientCertificate {
            tls.certificateChain = try NIOSSLCertificate.fromPEMBytes(Array(certificate.certificatePEM.utf8)).map { .certificate($0) }
            tls.privateKey = .privateKey(try NIOSSLPrivateKey(bytes: Array(certificate.keyPEM.reveal().utf8), format: .pem))
        }
        return tls
    }
}

/// A `private_key_jwt` client assertion (RFC 7523 §3, OpenID Connect Core §9): `iss` and `sub` the
/// client id, `aud` the upstream, a fresh `jti`, `iat` now and a short `exp`, signed by the first key.
enum ClientAssertion {
    static let type = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"

    struct NoKey: Error {}

    static func sign(clientID: String, audience: String, settings: ClientAssertionSettings, now: Date) throws -> String {
        let key = settings.keys[0]
        let issuedAt = Int(now.timeIntervalSince1970)
        let header: [String: Any] = ["alg": key.algorithm.rawValue, "kid": key.keyID, "typ": "JWT"]
        let claims: [String: Any] = [
            "iss": clientID, "sub": clientID, "aud": audience, "jti": SecureToken.generate(),
            "iat": issuedAt, "exp": issuedAt + Int(settings.lifetime.components.seconds),
        ]
        func segment(_ object: [String: Any]) throws -> String {
            Base64URL.encode(try JSONSerialization.data(withJSONObject: object, options: [.sortedKeys, .withoutEscapingSlashes]))
        }
        let input = try segment(header) + "." + segment(claims)
        return input + "." + Base64URL.encode(try key.sign(Data(input.utf8)))
    }
}
