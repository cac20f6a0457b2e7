import GatehouseCore
import Hummingbird

extension Gatehouse {
    /// `GET /healthz`: the process is up.
    func health() -> Response {
        .json(["status": "ok"], status: .ok)
    }

    /// `GET /readyz`: the process can serve sign-ins (its store answers).
    func readiness(_ request: Request) async -> Response {
        do {
            try await store.checkHealth()
            return .json(["status": "ready"], status: .ok)
        } catch {
            return .problem(.storeUnavailable(), for: request)
        }
    }
}
