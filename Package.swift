// swift-tools-version:6.0
import PackageDescription

// Layout: C libraries and shims (C*) at the bottom, the pure-Swift wire codec
// (SignalingProtocol) beside small shared utilities (SignalingSupport), the server
// and client libraries on top of those, and thin executables on top of everything.
let package = Package(
    name: "voip-signaling",
    platforms: [.macOS(.v15)],
    products: [
        .library(name: "SignalingProtocol", targets: ["SignalingProtocol"]),
        .library(name: "SignalingServer", targets: ["SignalingServer"]),
        .executable(name: "voipserver", targets: ["voipserver"]),
        // --- SignalingClient (issue 3) ---
        .library(name: "SignalingClient", targets: ["SignalingClient"]),
        // --- end SignalingClient ---
    ],
    targets: [
        // libevent (event loop, timers). Debian: libevent-dev.
        .systemLibrary(
            name: "CLibevent",
            pkgConfig: "libevent_pthreads",
            providers: [.apt(["libevent-dev"])]
        ),
        // Small C helpers for Linux APIs whose macros or structs Swift cannot import.
        .target(name: "CLinuxShims"),

        // The wire protocol: frames, codec, error and close codes. Pure Swift, no I/O.
        .target(name: "SignalingProtocol"),
        // Clocks, logging, command-line parsing and locks shared by every component.
        .target(name: "SignalingSupport"),

        .target(
            name: "SignalingServer",
            dependencies: ["CLibevent", "CLinuxShims", "SignalingProtocol", "SignalingSupport"]
        ),
        .executableTarget(
            name: "voipserver",
            dependencies: ["SignalingServer", "SignalingSupport"]
        ),

        .testTarget(name: "SignalingProtocolTests", dependencies: ["SignalingProtocol"]),
        .testTarget(
            name: "SignalingServerTests",
            dependencies: ["SignalingServer", "SignalingProtocol", "SignalingSupport", "CLinuxShims"]
        ),

        // --- SignalingClient (issue 3): the client library, its tests, and the small
        // executable the tests run inside network namespaces. ---
        .target(
            name: "SignalingClient",
            dependencies: ["CLinuxShims", "SignalingProtocol", "SignalingSupport"]
        ),
        .executableTarget(
            name: "signaling-client-probe",
            dependencies: ["SignalingClient", "SignalingProtocol", "SignalingSupport"]
        ),
        .testTarget(
            name: "SignalingClientTests",
            dependencies: ["SignalingClient", "SignalingProtocol", "SignalingSupport", "CLinuxShims"]
        ),
        // --- end SignalingClient ---
    ]
)
