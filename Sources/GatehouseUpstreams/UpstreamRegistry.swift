public import AsyncHTTPClient
public import GatehouseCore
public import Logging

/// The kinds of upstream Gatehouse speaks, by their `kind:` word: how each reads its settings
/// and makes its profile. A new kind is its own folder plus one line here.
public enum UpstreamRegistry {
    public struct Kind: Sendable {
        public let decoder: UpstreamKindDecoder
        public let make: @Sendable (UpstreamSettings, HTTPClient, Logger) -> any UpstreamProfile

        public init(decoder: UpstreamKindDecoder, make: @escaping @Sendable (UpstreamSettings, HTTPClient, Logger) -> any UpstreamProfile) {
            self.decoder = decoder
            self.make = make
        }
    }

    public static let kinds: [String: Kind] = [
        "oauth2": OAuth2Upstream.kind,
        "oidc": OIDCUpstream.kind,
        "franceconnect": FranceConnect.kind,
        "central": CentralUpstream.kind,
    ]

    /// The decoders `GatehouseConfiguration.decode` takes.
    public static var decoders: [String: UpstreamKindDecoder] { kinds.mapValues(\.decoder) }

    /// The profile of one configured upstream, of one of `kinds`.
    public static func profile(for settings: UpstreamSettings, httpClient: HTTPClient, logger: Logger,
                               kinds: [String: Kind] = kinds) -> any UpstreamProfile {
        guard let kind = kinds[settings.kind] else {
            preconditionFailure("the configuration accepted an unknown upstream kind '\(settings.kind)'")
        }
        return kind.make(settings, httpClient, logger)
    }
}

extension GatehouseConfiguration {
    /// Validates a configuration document with every kind of upstream Gatehouse knows.
    public static func decode(_ root: ConfigNode, secrets: SecretLookup) throws(ConfigErrors) -> GatehouseConfiguration {
        try decode(root, secrets: secrets, kinds: UpstreamRegistry.decoders)
    }
}
