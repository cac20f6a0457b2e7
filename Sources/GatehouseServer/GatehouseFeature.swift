import Foundation
import GatehouseCore
import Hummingbird
import Logging

/// One room of the house: a feature owning its routes and state. Each names, in its initialiser,
/// the dependencies it uses (the configuration in force, the store, the upstreams' profiles, the
/// limits, DPoP, the optional rooms it composes with), so one line tells a reader what a room
/// touches. What every room shares is only what these helpers need: the configuration in force.
protocol GatehouseFeature: Sendable {
    var configuration: GatehouseConfiguration { get }
}

/// A room that records codes, pushed authorization requests and other expiring records in the store.
protocol RecordingFeature: GatehouseFeature {
    var store: any GatehouseStore { get }
    var logger: Logger { get }
    var now: @Sendable () -> Date { get }
}

extension GatehouseFeature {
    /// The issuer identifier: the public base URL (RFC 8414 §2).
    var issuer: String { configuration.server.publicBaseURL }
}

extension RecordingFeature {
    /// The moment `lifetime` from now.
    func expiry(after lifetime: Duration) -> Date {
        let (seconds, attoseconds) = lifetime.components
        return now().addingTimeInterval(Double(seconds) + Double(attoseconds) / 1e18)
    }
}

extension Optional where Wrapped: GatehouseFeature {
    /// The feature's answer, or a 404 `not_found` problem when the feature is not configured.
    func answer(_ request: Request, _ body: (Wrapped) async -> Response) async -> Response {
        guard let feature = self else { return .problem(.notFound(), for: request) }
        return await body(feature)
    }
}
