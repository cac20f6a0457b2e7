public import AsyncHTTPClient
public import GatehouseCore
import GatehouseUpstreams

extension GatehouseConfiguration {
    /// One resolver per upstream that has an `identity:` section.
    public func identityResolvers(client: HTTPClient) -> [String: any IdentityResolver] {
        upstreams.compactMapValues { upstream -> (any IdentityResolver)? in
            guard let identity = upstream.identity else { return nil }
            switch identity.kind {
            case .personalInformation: return PersonalInformationResolver(settings: identity, client: client)
            case .introspection: return IntrospectionResolver(settings: identity, upstream: upstream, client: client)
            case .userinfo: return UserinfoResolver(settings: identity, client: client)
            case .jwt: return JWTResolver(settings: identity, client: client)
            case .session: return nil  // read from the sealed session (`SessionIdentity`)
            case .gatehouse:
                guard let central = upstream.profile as? CentralSettings else { return nil }
                return JWTResolver.minted(by: central.tokenKeys, settings: identity)
            }
        }
    }
}
