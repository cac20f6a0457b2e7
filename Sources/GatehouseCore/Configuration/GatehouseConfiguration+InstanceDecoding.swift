import Foundation

/// The settings of trusted app instances: `clients[].instances`, `mail`, `webviews`, `dpop`.
extension GatehouseConfiguration {
    static func decodeInstances(_ map: MappingReader, secrets: SecretLookup) -> InstanceSettings? {
        var settings = InstanceSettings()
        settings.unusedLifetime = map.duration("unused_lifetime", in: .seconds(3600)...(.seconds(3650 * 86400))) ?? settings.unusedLifetime
        settings.attestation = map.choice("attestation", default: AttestationPolicy.off)
        settings.pendingLifetime = map.duration("pending_lifetime", in: .seconds(60)...(.seconds(86400))) ?? settings.pendingLifetime
        settings.maximumPending = map.integer("max_pending", in: 1...10_000_000) ?? settings.maximumPending
        settings.manualCertification = map.bool("manual_certification") ?? false
        settings.apple = map.mapping("apple").flatMap { decodeApple($0, secrets: secrets) }
        settings.play = map.mapping("play").flatMap { decodePlay($0, secrets: secrets) }
        if settings.manualCertification, settings.attestation != .required {
            map.reader.report(map.childPath("manual_certification"), map.value("manual_certification"),
                              "applies only with attestation: required (only then does a sign-in wait for a certification)")
        }
        if settings.attestation != .off, map.value("apple") == nil, map.value("play") == nil, !settings.manualCertification {
            map.reader.report(map.childPath("attestation"), map.value("attestation"),
                              "needs a way to certify an instance: apple, play or manual_certification")
        }
        if settings.attestation == .off, map.value("apple") != nil || map.value("play") != nil {
            map.reader.report(map.childPath("attestation"), map.value("attestation") ?? map.node,
                              "is off: apple and play are used only with attestation: required or preferred")
        }
        map.finish()
        return settings
    }

    private static func decodeApple(_ map: MappingReader, secrets: SecretLookup) -> AppleAttestationSettings? {
        let appID = map.string("app_id", required: true)
        if let appID {
            let parts = appID.split(separator: ".", maxSplits: 1)
            if parts.count != 2 || parts[0].count != 10 || !parts[0].allSatisfy({ $0.isASCII && ($0.isUppercase || $0.isNumber) }) {
                map.reader.report(map.childPath("app_id"), map.value("app_id"),
                                  "must be the App ID: the 10-character team id, a dot, the bundle id (ABCDE12345.com.example.app)")
            }
        }
        let environment = map.string("environment") ?? "production"
        if !["production", "development"].contains(environment) {
            map.reader.report(map.childPath("environment"), map.value("environment"), "must be one of: production, development")
        }
        var roots: String?
        if let path = map.string("root_ca_file") {
            if let pem = try? secrets.readFile(path), pem.contains("-----BEGIN CERTIFICATE-----") {
                roots = pem
            } else {
                map.reader.report(map.childPath("root_ca_file"), map.value("root_ca_file"), "cannot read a PEM certificate from \(path)")
            }
        }
        map.finish()
        guard let appID else { return nil }
        return AppleAttestationSettings(appID: appID, development: environment == "development", rootCertificatesPEM: roots)
    }

    private static func decodePlay(_ map: MappingReader, secrets: SecretLookup) -> PlayIntegritySettings? {
        let package = map.string("package_name", required: true)
        func key(_ name: String, length: ClosedRange<Int>, what: String) -> Secret? {
            guard let path = map.string(name, required: true) else { return nil }
            guard let text = try? secrets.readFile(path) else {
                map.reader.report(map.childPath(name), map.value(name), "cannot read the file \(path)")
                return nil
            }
            let trimmed = text.trimmingCharacters(in: .whitespacesAndNewlines)
            guard let bytes = Data(base64Encoded: trimmed) ?? Base64URL.decode(trimmed), length.contains(bytes.count) else {
                map.reader.report(map.childPath(name), map.value(name), "must hold \(what) in base64, as the Play Console gives it")
                return nil
            }
            return Secret(trimmed)
        }
        let decryption = key("decryption_key_file", length: 32...32, what: "the 32-byte decryption key")
        let verification = key("verification_key_file", length: 64...200, what: "the DER EC P-256 verification key")
        let level = map.string("device_recognition") ?? "MEETS_DEVICE_INTEGRITY"
        let known = ["MEETS_BASIC_INTEGRITY", "MEETS_DEVICE_INTEGRITY", "MEETS_STRONG_INTEGRITY", "MEETS_VIRTUAL_INTEGRITY"]
        if !known.contains(level) {
            map.reader.report(map.childPath("device_recognition"), map.value("device_recognition"), "must be one of: " + known.joined(separator: ", "))
        }
        let age = map.duration("max_age", in: .seconds(10)...(.seconds(3600)))
        map.finish()
        guard let package, let decryption, let verification else { return nil }
        return PlayIntegritySettings(packageName: package, decryptionKey: decryption, verificationKey: verification,
                                     requiredDeviceVerdict: level, maximumAge: age ?? .seconds(300))
    }

    static func decodeMail(_ map: MappingReader, secrets: SecretLookup) -> MailSettings? {
        let host = map.string("smtp_host", required: true)
        let port = map.integer("smtp_port", in: 1...65535) ?? 587
        let startTLS = map.bool("starttls") ?? true
        let loopback = ["127.0.0.1", "::1", "localhost"].contains(host ?? "")
        if !startTLS, !loopback {
            map.reader.report(map.childPath("starttls"), map.value("starttls"),
                              "may be false only for a relay on this machine (a loopback host): codes never cross a network in clear")
        }
        var roots: String?
        if let path = map.string("ca_file") {
            if let pem = try? secrets.readFile(path), pem.contains("-----BEGIN CERTIFICATE-----") { roots = pem } else {
                map.reader.report(map.childPath("ca_file"), map.value("ca_file"), "cannot read a PEM certificate from \(path)")
            }
        }
        let username = map.string("username")
        let password = decodePassword(map, secrets: secrets)
        if (username == nil) != (password == nil) {
            map.reader.report(map.childPath("username"), map.value("username") ?? map.node, "username and a password go together")
        }
        if username != nil, !startTLS {
            map.reader.report(map.childPath("username"), map.value("username"), "AUTH is sent only after STARTTLS")
        }
        let from = map.string("from", required: true)
        if let from, !isAddress(from) {
            map.reader.report(map.childPath("from"), map.value("from"), "must be an e-mail address (local@domain)")
        }
        let timeout = map.duration("timeout", in: .seconds(1)...(.seconds(120)))
        map.finish()
        guard let host, let from else { return nil }
        return MailSettings(host: host, port: port, startTLS: startTLS, trustRootsPEM: roots, username: username, password: password,
                            from: from, timeout: timeout ?? .seconds(10))
    }

    /// A plain `local@domain` address: no spaces, brackets, quotes or control characters.
    public static func isAddress(_ text: String) -> Bool {
        let parts = text.split(separator: "@", omittingEmptySubsequences: false)
        guard parts.count == 2, !parts[0].isEmpty, parts[1].contains("."), text.utf8.count <= 254 else { return false }
        return text.unicodeScalars.allSatisfy { $0.value > 0x20 && $0.value < 0x7F && !"<>()[]\\,;:\"".unicodeScalars.contains($0) }
    }

    static func decodeWebviews(_ map: MappingReader) -> WebviewSettings? {
        var origins: [String] = []
        for item in map.list("origins", required: true) ?? [] {
            guard let text = map.reader.string(item.node, at: item.path) else { continue }
            if let origin = webOrigin(text) { origins.append(origin) } else {
                map.reader.report(item.path, item.node, "must be an origin: https://host[:port] (http only for a loopback host), no path")
            }
        }
        let lifetime = map.duration("cookie_lifetime", in: .seconds(60)...(.seconds(30 * 86400)))
        map.finish()
        guard !origins.isEmpty else { return nil }
        return WebviewSettings(origins: origins, cookieLifetime: lifetime ?? .seconds(3600))
    }

    /// `scheme://host[:port]` in canonical form (lowercase, no default port); `nil` when `text` is not
    /// an https origin (or an http one on a loopback host).
    public static func webOrigin(_ text: String) -> String? {
        guard let components = URLComponents(string: text), let scheme = components.scheme?.lowercased(),
              let host = components.host?.lowercased(), !host.isEmpty,
              components.user == nil, components.password == nil, components.query == nil, components.fragment == nil,
              components.path.isEmpty || components.path == "/" else { return nil }
        let loopback = ["127.0.0.1", "localhost", "[::1]", "::1"].contains(host)
        guard scheme == "https" || (scheme == "http" && loopback) else { return nil }
        let defaultPort = scheme == "https" ? 443 : 80
        let port = components.port.flatMap { $0 == defaultPort ? nil : $0 }
        return scheme + "://" + host + (port.map { ":\($0)" } ?? "")
    }

    static func decodeDPoP(_ map: MappingReader) -> DPoPSettings {
        var settings = DPoPSettings()
        settings.requireNonce = map.bool("nonce") ?? false
        settings.proofLifetime = map.duration("proof_lifetime", in: .seconds(5)...(.seconds(600))) ?? settings.proofLifetime
        settings.replayCacheEntries = map.integer("replay_cache_entries", in: 1000...10_000_000) ?? settings.replayCacheEntries
        settings.replayProtection = map.choice("replay_protection", default: DPoPSettings.ReplayProtection.store)
        settings.nonceEpoch = map.duration("nonce_epoch", in: .seconds(2)...(.seconds(600))) ?? settings.nonceEpoch
        map.finish()
        return settings
    }
}
