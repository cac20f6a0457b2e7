// swift-tools-version: 6.1
import PackageDescription

let upcoming: [SwiftSetting] = [
    .enableUpcomingFeature("ExistentialAny"),
    .enableUpcomingFeature("MemberImportVisibility"),
    .enableUpcomingFeature("InternalImportsByDefault"),
]

let package = Package(
    name: "Gatehouse",
    platforms: [.macOS(.v15), .iOS(.v15)],
    products: [
        .executable(name: "gatehouse", targets: ["gatehouse"]),
        // The apps' in-app sign-in client, GatehouseSignIn, is its own package: Clients/GatehouseSignIn.
    ],
    dependencies: [
        .package(url: "https://github.com/hummingbird-project/hummingbird.git", exact: "2.28.1"),
        .package(url: "https://github.com/swift-server/async-http-client.git", exact: "1.37.0"),
        .package(url: "https://github.com/apple/swift-crypto.git", exact: "4.5.2"),
        .package(url: "https://github.com/vapor/sqlite-nio.git", exact: "1.13.2"),
        .package(url: "https://github.com/vapor/postgres-nio.git", exact: "1.33.2"),
        .package(url: "https://github.com/apple/swift-nio-ssl.git", exact: "2.37.6"),
        .package(url: "https://github.com/jpsim/Yams.git", exact: "6.2.2"),
        .package(url: "https://github.com/apple/swift-argument-parser.git", exact: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log.git", exact: "1.16.2"),
        .package(url: "https://github.com/apple/swift-nio.git", exact: "2.101.3"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", exact: "2.13.0"),
        .package(url: "https://github.com/apple/swift-http-types.git", exact: "1.8.0"),
        .package(url: "https://github.com/vapor/jwt-kit.git", exact: "5.8.0"),
        .package(url: "https://github.com/apple/swift-nio-extras.git", exact: "1.35.2"),
        .package(url: "https://github.com/apple/swift-metrics.git", exact: "2.13.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus.git", exact: "2.4.1"),
        .package(url: "https://github.com/apple/swift-distributed-tracing.git", exact: "1.7.3"),
        .package(url: "https://github.com/apple/swift-service-context.git", exact: "1.5.1"),
        // OTLP/HTTP only: the gRPC exporter's packages are never built.
        .package(url: "https://github.com/swift-otel/swift-otel.git", exact: "1.6.0", traits: ["OTLPHTTP"]),
        .package(url: "https://github.com/apple/swift-certificates.git", exact: "1.21.1"),
        .package(url: "https://github.com/apple/swift-asn1.git", exact: "1.7.4"),
    ],
    targets: [
        .target(
            name: "GatehouseCore",
            dependencies: [
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "_CryptoExtras", package: "swift-crypto"),
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "SwiftASN1", package: "swift-asn1"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: upcoming
        ),
        .target(
            // Platform attestation of app instances (Apple App Attest, Google Play Integrity): pure
            // verification, no I/O, independent of the rest of Gatehouse.
            name: "GatehouseAttestation",
            dependencies: [
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "SwiftASN1", package: "swift-asn1"),
            ],
            swiftSettings: upcoming
        ),
        .target(
            name: "GatehouseStore",
            dependencies: [
                "GatehouseCore",
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "SQLiteNIO", package: "sqlite-nio"),
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: upcoming
        ),
        .target(
            name: "GatehouseUpstreams",
            dependencies: [
                "GatehouseCore",
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Tracing", package: "swift-distributed-tracing"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "JWTKit", package: "jwt-kit"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "_CryptoExtras", package: "swift-crypto"),
            ],
            swiftSettings: upcoming
        ),
        .target(
            name: "GatehouseRelay",
            dependencies: [
                "GatehouseCore",
                .product(name: "Metrics", package: "swift-metrics"),
                "GatehouseUpstreams",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "JWTKit", package: "jwt-kit"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
            ],
            swiftSettings: upcoming
        ),
        .target(
            // Sealed sessions and passthrough refreshes: the sessions behind Gatehouse's own tokens,
            // the upstream refresh that cannot race, revocations told to the other instances. No HTTP server.
            name: "GatehouseSessions",
            dependencies: [
                "GatehouseCore",
                "GatehouseUpstreams",
                "GatehouseRelay",
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: upcoming
        ),
        .target(
            name: "GatehouseServer",
            dependencies: [
                "GatehouseCore",
                "GatehouseStore",
                "GatehouseUpstreams",
                "GatehouseRelay",
                "GatehouseSessions",
                "GatehouseAttestation",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOHTTPTypesHTTP1", package: "swift-nio-extras"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "UnixSignals", package: "swift-service-lifecycle"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Yams", package: "Yams"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Tracing", package: "swift-distributed-tracing"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "OTel", package: "swift-otel"),
                .product(name: "ServiceContextModule", package: "swift-service-context"),
            ],
            swiftSettings: upcoming
        ),
        .executableTarget(
            name: "gatehouse",
            dependencies: [
                "GatehouseServer",
                "GatehouseSessions",
                "GatehouseCore",
                "GatehouseRelay",
                "GatehouseStore",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: upcoming
        ),
        .testTarget(
            name: "GatehouseCoreTests",
            dependencies: [
                "GatehouseCore", "GatehouseUpstreams",
                .product(name: "Crypto", package: "swift-crypto"),
            ],
            swiftSettings: upcoming
        ),
        .testTarget(
            name: "GatehouseAttestationTests",
            dependencies: [
                "GatehouseAttestation",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "SwiftASN1", package: "swift-asn1"),
            ],
            swiftSettings: upcoming
        ),
        .testTarget(
            name: "GatehouseRelayTests",
            dependencies: [
                "GatehouseRelay", "GatehouseCore", "GatehouseUpstreams", .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "MetricsTestKit", package: "swift-metrics"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
            ],
            swiftSettings: upcoming
        ),
        .testTarget(
            name: "GatehouseUpstreamsTests",
            dependencies: [
                "GatehouseUpstreams",
                "GatehouseCore",
                .product(name: "JWTKit", package: "jwt-kit"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "_CryptoExtras", package: "swift-crypto"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "MetricsTestKit", package: "swift-metrics"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
            ],
            path: "Tests/GatehouseUpstreamsTests",
            swiftSettings: upcoming
        ),
        .testTarget(
            name: "GatehouseServerTests",
            dependencies: [
                "GatehouseServer",
                "GatehouseSessions",
                "GatehouseStore",
                "GatehouseCore",
                "GatehouseUpstreams",
                "GatehouseRelay",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "HummingbirdTesting", package: "hummingbird"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "MetricsTestKit", package: "swift-metrics"),
                .product(name: "Crypto", package: "swift-crypto"),
            ],
            swiftSettings: upcoming
        ),
        .testTarget(
            name: "GatehouseSessionsTests",
            dependencies: [
                "GatehouseSessions", "GatehouseCore", "GatehouseUpstreams", "GatehouseRelay",
                // The real store under the passthrough refresher's coordination (SQLite, in memory).
                "GatehouseStore",
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: upcoming
        ),
        .testTarget(
            // One store contract, run on SQLite and, when GATEHOUSE_TEST_POSTGRES names a server, PostgreSQL.
            name: "GatehouseStoreTests",
            dependencies: [
                "GatehouseStore",
                "GatehouseCore",
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ],
            swiftSettings: upcoming
        ),
    ]
)
