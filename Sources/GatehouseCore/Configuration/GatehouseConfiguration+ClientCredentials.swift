import Foundation

extension GatehouseConfiguration {
    /// An upstream's key credentials and trust roots, as `client_auth` calls for them.
    struct ClientCredentials {
        var assertion: ClientAssertionSettings?
        var certificate: ClientCertificate?
        var trustRoots: String?
    }

    /// `client_assertion`, `client_certificate` and `ca_file` of one upstream: each file read once
    /// (relative to the configuration's folder; a reload refuses a changed one) and checked here,
    /// so a key that cannot sign or a certificate that is not the key's is a problem with its
    /// path and line. `nil` when the method's credential is missing or unusable.
    static func decodeClientCredentials(_ map: MappingReader, authentication: ClientAuthentication, secrets: SecretLookup)
        -> ClientCredentials?
    {
        var credentials = ClientCredentials()
        var usable = true
        if let assertion = map.mapping("client_assertion") {
            if authentication != .privateKeyJWT {
                map.reader.report(assertion.path, assertion.node, "applies only with client_auth: private_key_jwt")
            }
            credentials.assertion = decodeClientAssertion(assertion, secrets: secrets)
            usable = usable && credentials.assertion != nil
        } else if authentication == .privateKeyJWT {
            map.reader.report(map.childPath("client_assertion"), map.node,
                              "is required with client_auth: private_key_jwt (keys: the PEM files of the keys that sign)")
            usable = false
        }
        if let certificate = map.mapping("client_certificate") {
            if !authentication.usesCertificate {
                map.reader.report(certificate.path, certificate.node, "applies only with client_auth: tls_client_auth or self_signed_tls_client_auth")
            }
            credentials.certificate = decodeClientCertificate(certificate, secrets: secrets)
            usable = usable && credentials.certificate != nil
            if authentication == .selfSignedTLSClientAuth, let client = credentials.certificate, client.publicJWK == nil {
                map.reader.report(certificate.childPath("certificate"), certificate.value("certificate"),
                                  "holds a certificate whose key is neither RSA, P-256 nor P-384: it cannot be published for self_signed_tls_client_auth")
                usable = false
            }
        } else if authentication.usesCertificate {
            map.reader.report(map.childPath("client_certificate"), map.node,
                              "is required with client_auth: \(authentication.rawValue) (certificate and key: PEM files)")
            usable = false
        }
        if let path = map.string("ca_file") {
            credentials.trustRoots = certificatesFile("ca_file", path: path, in: map, secrets: secrets)
        }
        return usable ? credentials : nil
    }

    private static func decodeClientAssertion(_ map: MappingReader, secrets: SecretLookup) -> ClientAssertionSettings? {
        let algorithm = map.value("algorithm") == nil ? nil : map.choice("algorithm", default: ClientAssertionAlgorithm.rs256)
        let keyID = map.string("kid")
        let items = map.list("keys", required: true) ?? []
        if keyID != nil, items.count > 1 {
            // A kid follows its key, not a place in the list: rotating would give the new key the old one's kid.
            map.reader.report(map.childPath("kid"), map.value("kid"), "applies to a single key: with several, each is named by its RFC 7638 thumbprint")
        }
        var keys: [ClientAssertionKey] = []
        var thumbprints: Set<String> = []
        for item in items {
            guard let path = map.reader.string(item.node, at: item.path) else { continue }
            guard let pem = try? secrets.readFile(path) else {
                map.reader.report(item.path, item.node, "cannot read the file \(path)")
                continue
            }
            do throws(ClientCredentialError) {
                let key = try ClientAssertionKey(pem: pem, algorithm: algorithm, keyID: items.count == 1 ? keyID : nil)
                if thumbprints.insert(key.thumbprint).inserted {
                    keys.append(key)
                } else {
                    map.reader.report(item.path, item.node, "is the same key as another in keys (thumbprint \(key.thumbprint))")
                }
            } catch {
                map.reader.report(item.path, item.node, "\(path) \(error.message)")
            }
        }
        if map.value("keys") != nil, items.isEmpty {
            map.reader.report(map.childPath("keys"), map.value("keys"), "must list at least one key file (the first signs)")
        }
        let audience: ClientAssertionAudience
        switch map.string("audience") {
        case nil, "issuer": audience = .issuer
        case "endpoint": audience = .endpoint
        case "token_endpoint": audience = .tokenEndpoint
        case let url?:
            if let problem = problemWithEndpoint(url) {
                map.reader.report(map.childPath("audience"), map.value("audience"), "must be issuer, endpoint, token_endpoint or a URL: \(problem)")
            }
            audience = .url(url)
        }
        let lifetime = map.duration("lifetime", in: .seconds(5)...(.seconds(300)))
        map.finish()
        guard !keys.isEmpty, keys.count == items.count else { return nil }
        return ClientAssertionSettings(keys: keys, audience: audience, lifetime: lifetime ?? .seconds(60))
    }

    private static func decodeClientCertificate(_ map: MappingReader, secrets: SecretLookup) -> ClientCertificate? {
        let certificatePath = map.string("certificate", required: true)
        let keyPath = map.string("key", required: true)
        map.finish()
        guard let certificatePath, let keyPath else { return nil }
        guard let certificatePEM = try? secrets.readFile(certificatePath) else {
            map.reader.report(map.childPath("certificate"), map.value("certificate"), "cannot read the file \(certificatePath)")
            return nil
        }
        guard let keyPEM = try? secrets.readFile(keyPath) else {
            map.reader.report(map.childPath("key"), map.value("key"), "cannot read the file \(keyPath)")
            return nil
        }
        do throws(ClientCertificateError) {
            return try ClientCertificate(certificatePEM: certificatePEM, keyPEM: keyPEM)
        } catch {
            switch error {
            case .certificate(let message): map.reader.report(map.childPath("certificate"), map.value("certificate"), "\(certificatePath) \(message)")
            case .key(let message): map.reader.report(map.childPath("key"), map.value("key"), "\(keyPath) \(message)")
            }
            return nil
        }
    }
}
