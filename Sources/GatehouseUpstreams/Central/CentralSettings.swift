public import Foundation
public import GatehouseCore

/// The `central` kind's own settings: a central sign-in provider in the broccoliapps style
/// (seed 002). The provider signs people in and hands back a one-minute code; Gatehouse, the
/// app's backend, verifies it server to server with an RSA-signed call and mints the app's tokens.
public struct CentralSettings: UpstreamProfileSettings {
    /// Which sign-in the provider's `/auth` page runs for `/oauth/authorize`.
    public enum Provider: String, Sendable, CaseIterable { case google, apple }
    /// The seed's two sets of default lifetimes.
    public enum Environment: String, Sendable, CaseIterable { case production, development }
    /// When a refresh token is replaced.
    public enum Rotation: String, Sendable, CaseIterable {
        /// Every use (RFC 9700 §4.14.2), with the grace window and family revocation of sealed sessions.
        case everyUse = "every_use"
        /// The seed's rule: only once 80 % of its lifetime has passed. Weaker: a stolen token
        /// stays usable alongside the real one for most of a year.
        case after80Percent = "after_80_percent"
    }

    /// The seed's `/auth/*` endpoints for broccoliapps-style apps, and the app client whose sessions they are.
    public struct AppAPI: Sendable {
        public var path: String
        public var clientID: String
    }

    /// Sign in with Apple on iOS (`POST {path}/verify-apple`).
    public struct Apple: Sendable {
        public static let issuer = "https://appleid.apple.com"
        public var bundleID: String
        public var jwksURL: String
        /// `require_nonce` (default true): a request without the raw nonce is refused.
        public var requireNonce: Bool

        public init(bundleID: String, jwksURL: String, requireNonce: Bool = true) {
            self.bundleID = bundleID
            self.jwksURL = jwksURL
            self.requireNonce = requireNonce
        }
    }

    /// S2S base: `{apiBase}/v1/auth/verify`. The broccoliapps provider's routes are under `/api`
    /// (`https://www.broccoliapps.com/api`); the signature covers the whole path, `/api/v1/auth/verify`.
    public var apiBase: String
    /// Browser base: `{webBase}/auth?app=…&provider=…`.
    public var webBase: String
    public var provider: Provider
    /// The app's RSA private key registered with the provider: signs every S2S request.
    public var s2sKey: CentralRequestSigner
    /// Gatehouse's RS256 keys for the tokens it mints; the first signs.
    public var tokenKeys: CentralTokenKeys
    public var accessTokenLifetime: Duration
    public var refreshTokenLifetime: Duration
    public var rotation: Rotation
    /// Magic links per mailbox per hour (`magic_link_limit`, the provider's 5 by default).
    public var magicLinkLimit: Int
    /// Magic links per client address per hour, whatever their mailboxes (`magic_link_address_limit`).
    public var magicLinkAddressLimit: Int
    public var appAPI: AppAPI?
    public var apple: Apple?

    public init(apiBase: String, webBase: String, provider: Provider = .google, s2sKey: CentralRequestSigner, tokenKeys: CentralTokenKeys,
                accessTokenLifetime: Duration = .seconds(86400), refreshTokenLifetime: Duration = .seconds(365 * 86400),
                rotation: Rotation = .everyUse, magicLinkLimit: Int = 5, magicLinkAddressLimit: Int = 20, appAPI: AppAPI? = nil,
                apple: Apple? = nil) {
        self.apiBase = apiBase
        self.webBase = webBase
        self.provider = provider
        self.s2sKey = s2sKey
        self.tokenKeys = tokenKeys
        self.accessTokenLifetime = accessTokenLifetime
        self.refreshTokenLifetime = refreshTokenLifetime
        self.rotation = rotation
        self.magicLinkLimit = magicLinkLimit
        self.magicLinkAddressLimit = magicLinkAddressLimit
        self.appAPI = appAPI
        self.apple = apple
    }

    public var mintsTokens: Bool { true }
    public var mintedTokens: MintedTokenVerification? {
        MintedTokenVerification(issuer: tokenKeys.issuer, audience: tokenKeys.audience, jwksDocument: tokenKeys.jwksDocument)
    }
    public var namedClients: [(key: String, clientID: String)] { appAPI.map { [("app_api.client", $0.clientID)] } ?? [] }
    public var servedPaths: [(key: String, path: String)] { appAPI.map { [("app_api.path", $0.path)] } ?? [] }
}

extension CentralSettings {
    static func decode(_ map: MappingReader, clientID: String?) -> CentralSettings? {
        let apiBase = GatehouseConfiguration.endpoint("api_base", in: map).map(trimmingSlash).flatMap { base -> String? in
            // The S2S signature covers the request's path, api_base's own included: keep that path to
            // characters sent as written, so the path signed is the path the provider receives.
            let afterScheme = base.range(of: "://").map { base[$0.upperBound...] } ?? base[...]
            let path = afterScheme.firstIndex(of: "/").map { afterScheme[$0...] } ?? ""
            let allowed = Set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/-._~")
            guard !base.contains("?"), path.allSatisfy(allowed.contains), !path.contains("//") else {
                map.reader.report(map.childPath("api_base"), map.value("api_base"),
                                  "must have no query and a path of letters, digits and / - . _ ~ only (the S2S signature covers it)")
                return nil
            }
            return base
        }
        let webBase = GatehouseConfiguration.endpoint("web_base", in: map).map(trimmingSlash)
        let provider = map.choice("provider", default: Provider.google)
        let environment = map.choice("environment", default: Environment.production)
        let access = map.duration("access_token_lifetime", in: .seconds(30)...(.seconds(30 * 86400)))
            ?? (environment == .production ? .seconds(86400) : .seconds(300))
        let refresh = map.duration("refresh_token_lifetime", in: .seconds(60)...(.seconds(2 * 365 * 86400)))
            ?? (environment == .production ? .seconds(365 * 86400) : .seconds(3600))
        let rotation = map.choice("refresh_rotation", default: Rotation.everyUse)
        let limit = map.integer("magic_link_limit", in: 1...1000) ?? 5
        let addressLimit = map.integer("magic_link_address_limit", in: 1...100_000) ?? 20
        let s2sKey = map.string("s2s_private_key_file", required: true).flatMap { path -> CentralRequestSigner? in
            guard let pem = readKeyFile(path, key: "s2s_private_key_file", in: map) else { return nil }
            do {
                return try CentralRequestSigner(privateKeyPEM: pem)
            } catch {
                map.reader.report(map.childPath("s2s_private_key_file"), map.value("s2s_private_key_file"),
                                  "\(path) is not an RSA private key (PEM) of at least 2048 bits")
                return nil
            }
        }
        var pems: [String] = []
        var tokenKeysUsable = true
        for item in map.list("signing_key_files", required: true) ?? [] {
            guard let path = map.reader.string(item.node, at: item.path) else { tokenKeysUsable = false; continue }
            guard let pem = readKeyFile(path, key: "signing_key_files", in: map) else { tokenKeysUsable = false; continue }
            pems.append(pem)
        }
        if map.value("signing_key_files") != nil, pems.isEmpty, tokenKeysUsable {
            map.reader.report(map.childPath("signing_key_files"), map.value("signing_key_files"), "must list at least one key file")
        }
        let issuer = map.string("token_issuer") ?? clientID ?? ""
        var tokenKeys: CentralTokenKeys?
        if !pems.isEmpty, tokenKeysUsable {
            do {
                tokenKeys = try CentralTokenKeys(privateKeyPEMs: pems, issuer: issuer, audience: clientID ?? "")
            } catch {
                map.reader.report(map.childPath("signing_key_files"), map.value("signing_key_files"),
                                  "every file must hold an RSA private key (PEM) of at least 2048 bits")
            }
        }
        var appAPI: AppAPI?
        if let api = map.mapping("app_api") {
            let path = api.string("path") ?? "/auth"
            let allowed = Set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/_.-")
            if !path.hasPrefix("/") || path.hasSuffix("/") || path.contains("//") || !path.allSatisfy(allowed.contains)
                || ["/oauth", "/.well-known", "/app"].contains(where: { path == $0 || path.hasPrefix($0 + "/") }) {
                api.reader.report(api.childPath("path"), api.value("path"),
                                  "must be an absolute path of letters, digits and / _ . - without a trailing '/', outside /oauth, /app and /.well-known")
            }
            let client = api.string("client", required: true)
            api.finish()
            if let client { appAPI = AppAPI(path: path, clientID: client) }
        }
        var apple: Apple?
        if let section = map.mapping("apple") {
            let bundleID = section.string("bundle_id", required: true)
            let jwks = section.value("jwks_url") == nil ? "https://appleid.apple.com/auth/keys" : GatehouseConfiguration.endpoint("jwks_url", in: section)
            let requireNonce = section.bool("require_nonce") ?? true
            section.finish()
            if let bundleID, let jwks { apple = Apple(bundleID: bundleID, jwksURL: jwks, requireNonce: requireNonce) }
        }
        guard let apiBase, let webBase, let s2sKey, let tokenKeys else { return nil }
        return CentralSettings(apiBase: apiBase, webBase: webBase, provider: provider, s2sKey: s2sKey, tokenKeys: tokenKeys,
                               accessTokenLifetime: access, refreshTokenLifetime: refresh, rotation: rotation,
                               magicLinkLimit: limit, magicLinkAddressLimit: addressLimit, appAPI: appAPI, apple: apple)
    }

    private static func trimmingSlash(_ url: String) -> String {
        url.hasSuffix("/") ? String(url.dropLast()) : url
    }

    private static func readKeyFile(_ path: String, key: String, in map: MappingReader) -> String? {
        guard let text = try? String(contentsOfFile: path, encoding: .utf8) else {
            map.reader.report(map.childPath(key), map.value(key), "cannot read the file \(path)")
            return nil
        }
        return text
    }
}
