// swift-tools-version: 6.1
// GatehouseSignIn: the apps' Swift client of Gatehouse's in-app sign-in (docs/in-app-sign-in.md),
// a package of its own so that an app resolves one dependency, swift-crypto, over a range of
// versions, and nothing of the server (docs/client-package.md).
import PackageDescription

let upcoming: [SwiftSetting] = [
    .enableUpcomingFeature("ExistentialAny"),
    .enableUpcomingFeature("MemberImportVisibility"),
    .enableUpcomingFeature("InternalImportsByDefault"),
]

let package = Package(
    name: "GatehouseSignIn",
    // iOS 15: the library's async URLSession. macOS 15: the driver and the tests use Synchronization's Mutex.
    platforms: [.iOS(.v15), .macOS(.v15)],
    products: [
        .library(name: "GatehouseSignIn", targets: ["GatehouseSignIn"]),
        // The line-oriented driver the end-to-end suite runs the client through.
        .executable(name: "gatehouse-signin", targets: ["gatehouse-signin"]),
    ],
    dependencies: [
        // A range, not a pin: swift-crypto 3 and 4 both serve the client (P256 signing, SHA-256),
        // so an app on either resolves. Built and tested with 4.5.2 (this package) and 3.12.3
        // (Clients/Examples/SignInApp).
        .package(url: "https://github.com/apple/swift-crypto.git", "3.0.0"..<"5.0.0"),
    ],
    targets: [
        .target(
            // The client of the authorization challenge endpoint: the seed's in-app sign-in state
            // machine for first-party apps. Foundation and swift-crypto only (CryptoKit on Apple).
            name: "GatehouseSignIn",
            dependencies: [
                .product(name: "Crypto", package: "swift-crypto"),
            ],
            swiftSettings: upcoming
        ),
        .executableTarget(
            // A line-oriented driver of GatehouseSignIn: what an app's screens would call, as JSON
            // lines on stdin and stdout. The end-to-end tests run the client through it.
            name: "gatehouse-signin",
            dependencies: ["GatehouseSignIn"],
            swiftSettings: upcoming
        ),
        .testTarget(
            name: "GatehouseSignInTests",
            dependencies: ["GatehouseSignIn", .product(name: "Crypto", package: "swift-crypto")],
            swiftSettings: upcoming
        ),
    ]
)
