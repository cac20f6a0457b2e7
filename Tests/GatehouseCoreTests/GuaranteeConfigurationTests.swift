import Foundation
@testable import GatehouseCore
import GatehouseUpstreams
import Testing

/// What check-config refuses because Gatehouse could not enforce it, and the limits that are on
/// unless the file turns them off.
struct GuaranteeConfigurationTests {
    typealias C = CentralConfigurationTests

    @Test func aCentralAppAPIClientCannotRequireAttestation() {
        let document = C.document(
            upstream: [("app_api", C.m([("client", C.s("tasquito-app"))]))],
            client: [("instances", C.m([("attestation", C.s("required")), ("manual_certification", C.s("false")),
                                        ("apple", C.m([("app_id", C.s("ABCDE12345.com.broccoliapps.tasquito"))]))]))])
        let problems = C.problems(document)
        #expect(problems.contains { $0.contains("app_api.client") && $0.contains("attestation: required") }, "\(problems)")
        // Without the app API, the same client is enforced on the standard face: accepted.
        let standard = C.document(client: [("instances", C.m([
            ("attestation", C.s("required")), ("apple", C.m([("app_id", C.s("ABCDE12345.com.broccoliapps.tasquito"))])),
        ]))])
        #expect(C.problems(standard).isEmpty, "\(C.problems(standard))")
    }

    @Test func registrationAndUnknownRefreshLimitsAreOnByDefault() throws {
        let configuration = try GatehouseConfiguration.decode(ConfigurationTests.document(), secrets: ConfigurationTests.secrets)
        let limits = configuration.operations.rateLimits
        #expect(limits.registrationPerAddress != nil)
        #expect(limits.registrationPerApp != nil)
        #expect(limits.unknownRefreshPerAddress != nil)
        #expect(configuration.clients["com.example.app"]?.unknownRefreshTokens == .forward)
    }

    @Test func theDefaultLimitsCanBeSetOrTurnedOff() throws {
        var document = ConfigurationTests.document()
        guard case .mapping(var entries, let line) = document else { Issue.record("not a mapping"); return }
        entries.append((key: "rate_limits", value: ConfigurationTests.map([
            ("registration_per_address", ConfigurationTests.scalar("off")),
            ("registration_per_app", ConfigurationTests.map([("per_second", ConfigurationTests.scalar("2")),
                                                             ("burst", ConfigurationTests.scalar("7"))])),
        ])))
        document = .mapping(entries, line: line)
        let limits = try GatehouseConfiguration.decode(document, secrets: ConfigurationTests.secrets).operations.rateLimits
        #expect(limits.registrationPerAddress == nil)
        #expect(limits.registrationPerApp == BucketSettings(perSecond: 2, burst: 7))
        #expect(limits.unknownRefreshPerAddress != nil)
    }

    @Test func unknownRefreshTokensAppliesToPassthroughAppsOnly() throws {
        let refuse = try GatehouseConfiguration.decode(
            ConfigurationTests.document(client: [("unknown_refresh_tokens", ConfigurationTests.scalar("refuse"))]),
            secrets: ConfigurationTests.secrets)
        #expect(refuse.clients["com.example.app"]?.unknownRefreshTokens == .refuse)
        let sealed = ConfigurationTests.problems(Self.replacing("token_exposure", with: "sealed", in: ConfigurationTests.document(client: [
            ("unknown_refresh_tokens", ConfigurationTests.scalar("refuse")),
        ])))
        #expect(sealed.contains { $0.contains("unknown_refresh_tokens") }, "\(sealed)")
    }

    /// `document` with every `key: …` scalar of a client replaced by `value`.
    static func replacing(_ key: String, with value: String, in node: ConfigNode) -> ConfigNode {
        switch node {
        case .mapping(let entries, let line):
            return .mapping(entries.map { entry in
                if entry.key == key, case .scalar(_, let at) = entry.value { return (key: key, value: .scalar(value, line: at)) }
                return (key: entry.key, value: replacing(key, with: value, in: entry.value))
            }, line: line)
        case .sequence(let items, let line):
            return .sequence(items.map { replacing(key, with: value, in: $0) }, line: line)
        default:
            return node
        }
    }

    @Test func pendingInstancesHaveTheirOwnShortLifetimeAndCap() throws {
        let configuration = try GatehouseConfiguration.decode(ConfigurationTests.document(client: [
            ("instances", ConfigurationTests.map([("pending_lifetime", ConfigurationTests.scalar("5m")),
                                                  ("max_pending", ConfigurationTests.scalar("12"))])),
        ]), secrets: ConfigurationTests.secrets)
        let settings = try #require(configuration.clients["com.example.app"]?.instances)
        #expect(settings.pendingLifetime == .seconds(300))
        #expect(settings.maximumPending == 12)
        #expect(InstanceSettings().pendingLifetime < InstanceSettings().unusedLifetime)
    }
}
