// swift-tools-version: 6.1
// An app that adds GatehouseSignIn (docs/client-package.md), and proves it resolves next to a
// swift-crypto other than the server's: the server pins 4.5.2, this app pins 3.12.3, and the
// client's range (3.0.0 up to, not including, 5.0.0) takes either. scripts/test builds and runs it.
import PackageDescription

let package = Package(
    name: "SignInApp",
    platforms: [.iOS(.v15), .macOS(.v15)],
    dependencies: [
        // A checkout of this repository; a released app writes
        // .package(url: "https://github.com/<owner>/GatehouseSignIn.git", from: "<version>") instead.
        .package(path: "../../GatehouseSignIn"),
        // The app's own pin, on the other major version than the server's.
        .package(url: "https://github.com/apple/swift-crypto.git", exact: "3.12.3"),
    ],
    targets: [
        .executableTarget(
            name: "SignInApp",
            dependencies: [
                .product(name: "GatehouseSignIn", package: "GatehouseSignIn"),
                .product(name: "Crypto", package: "swift-crypto"),
            ]
        ),
    ]
)
