public import AsyncHTTPClient
public import GatehouseCore
import GatehouseUpstreams

extension GatehouseConfiguration {
    /// One resolver per upstream that has an `identity:` section; those that call a service per
    /// token share nothing: each has its own `identity_concurrency` limit.
    public func identityResolvers(client: HTTPClient) -> [String: any IdentityResolver] {
        let concurrency = operations.rateLimits.identityConcurrency
        var resolvers: [String: any IdentityResolver] = [:]
        for (name, upstream) in upstreams {
            guard let identity = upstream.identity else { continue }
            // The upstream's ca_file and client certificate go to the identity endpoints that are its
            // own (introspection, userinfo: RFC 8705 §3, a certificate-bound token is only accepted
            // with its certificate), not to a separate identity service. The configuration loader
            // built them once already.
            let tls = try? upstream.tlsConfiguration()
            switch identity.kind {
            case .personalInformation:
                resolvers[name] = PersonalInformationResolver(settings: identity, upstream: name, client: client, concurrency: concurrency)
            case .introspection:
                resolvers[name] = IntrospectionResolver(settings: identity, upstream: upstream, client: client, concurrency: concurrency, tls: tls)
            case .userinfo:
                resolvers[name] = UserinfoResolver(settings: identity, upstream: name, client: client, concurrency: concurrency, tls: tls)
            case .jwt:
                // Validated here: no call per token, only key set fetches.
                resolvers[name] = JWTResolver(settings: identity, upstream: name, client: client)
            case .session:
                continue  // read from the sealed session (`SessionIdentity`)
            case .gatehouse:
                guard let minted = upstream.profile.mintedTokens else { continue }
                resolvers[name] = JWTResolver.minted(by: minted, settings: identity)
            }
        }
        return resolvers
    }
}
