import GatehouseCore
import Hummingbird

/// Sends requests under a configured route prefix to the relay, and an ingress's questions
/// (`/forward-auth`, with `forward_auth:`) to the decision endpoint; everything else goes on to
/// the router (where anything unknown is a 404, never relayed).
struct RelayMiddleware<Context: GatehouseRequestContextProtocol>: RouterMiddleware {
    let holder: GatehouseHolder

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        let gatehouse = holder.current
        if ForwardAuthFace.owns(request.uri.path), let face = gatehouse.forwardAuthFace {
            return await face.serve(request, context: context)
        }
        guard let route = gatehouse.configuration.route(for: request.uri.path) else {
            return try await next(request, context)
        }
        // Routes are configured, so the relay is: a request under a prefix never reaches the router.
        guard let relay = gatehouse.relayFace else { return .problem(.notFound(), for: request) }
        return await relay.serve(request, context: context, route: route)
    }
}
