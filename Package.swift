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
        .executable(name: "voipload", targets: ["voipload"]),
        // --- SignalingClient (issue 3) ---
        .library(name: "SignalingClient", targets: ["SignalingClient"]),
        // --- end SignalingClient ---
        // --- voipclient (issue 4) ---
        .executable(name: "voipclient", targets: ["voipclient"]),
        // --- end voipclient ---
    ],
    targets: [
        // libevent (event loop, timers). Debian: libevent-dev.
        .systemLibrary(
            name: "CLibevent",
            pkgConfig: "libevent",
            providers: [.apt(["libevent-dev"])]
        ),
        // The libevent functions the Swift code uses, behind a header with no system includes.
        .target(name: "CLibeventShims", dependencies: ["CLibevent"]),
        // Small C helpers for Linux APIs whose macros or structs Swift cannot import.
        .target(name: "CLinuxShims"),

        // The wire protocol: frames, codec, error and close codes. Pure Swift, no I/O.
        .target(name: "SignalingProtocol"),

        // ---- Cryptography (issue 15): OpenSSL's libcrypto and what is built on it ------
        // OpenSSL 3. Debian: libssl-dev. Swift calls it through COpenSSLShims only.
        .systemLibrary(name: "COpenSSL", pkgConfig: "openssl", providers: [.apt(["libssl-dev"])]),
        .target(name: "COpenSSLShims", dependencies: ["COpenSSL"]),
        // HMAC-SHA256, constant-time comparison, random bytes; device tokens and their keys.
        .target(name: "SignalingCrypto", dependencies: ["COpenSSLShims"]),
        .testTarget(
            name: "SignalingCryptoTests",
            dependencies: ["SignalingCrypto", "SignalingServer", "SignalingProtocol", "SignalingSupport", "TestSupport"]
        ),
        // What checking a HELLO's credentials costs per core (release build; docs/AUTH.md).
        .executableTarget(name: "token-bench", dependencies: ["SignalingCrypto", "SignalingSupport"], path: "Tools/token-bench"),
        // ---- end cryptography ----
        // Clocks, logging, command-line parsing and locks shared by every component.
        .target(name: "SignalingSupport", dependencies: ["CLinuxShims"]),

        // What must survive a restart: the EventStore protocol and its record types.
        .target(name: "SignalingStore", dependencies: ["SignalingProtocol"]),

        .target(
            name: "SignalingServer",
            dependencies: [
                "CLibeventShims", "CLinuxShims", "SignalingProtocol", "SignalingPush", "SignalingStore",
                "SignalingStoreSQLite", "SignalingSupport", "SignalingCrypto",
            ]
        ),
        .executableTarget(
            name: "voipserver",
            dependencies: ["SignalingServer", "SignalingSupport", "SignalingSystemd"]
        ),

        // Helpers shared by test targets: running the executables as real subprocesses.
        .target(
            name: "TestSupport", dependencies: ["SignalingSupport", "SignalingStore", "SQLiteStoreFixtures"],
            path: "Tests/TestSupport"
        ),
        .testTarget(name: "SignalingProtocolTests", dependencies: ["SignalingProtocol"]),
        .testTarget(name: "SignalingSupportTests", dependencies: ["SignalingSupport"]),
        .testTarget(
            name: "SignalingServerTests",
            dependencies: [
                "SignalingServer", "SignalingProtocol", "SignalingPush", "SignalingStore", "SignalingSupport", "CLinuxShims",
                "TestSupport", "SignalingCrypto",
            ]
        ),

        // ---- Push wake-ups (issue 6): the gateway client and its tests ------------------
        // Its own libevent loop on its own thread sends HTTP wake-ups to the configured
        // push gateway; the server only calls `submit`. See docs/PUSH.md.
        .target(
            name: "SignalingPush",
            dependencies: ["CLibeventShims", "CLinuxShims", "SignalingSupport", "SignalingStore"]
        ),
        .testTarget(
            name: "SignalingPushTests",
            dependencies: ["SignalingPush", "SignalingStore", "SignalingSupport", "TestSupport"]
        ),

        // ---- Load tool (issue 5): voipload and its smoke test --------------------------
        // The engine (worker event loop, coordinator, histograms, /proc readers) is a
        // library so its parts can be unit-tested; the executable only parses and runs.
        .target(
            name: "VoipLoadKit",
            dependencies: ["CLinuxShims", "SignalingProtocol", "SignalingSupport", "SignalingCrypto"],
            path: "Tools/voipload/VoipLoadKit"
        ),
        .executableTarget(
            name: "voipload",
            dependencies: ["VoipLoadKit", "SignalingSupport"],
            path: "Tools/voipload/Command"
        ),
        .testTarget(
            name: "VoipLoadTests",
            dependencies: ["VoipLoadKit", "CLinuxShims", "SignalingProtocol", "SignalingSupport", "TestSupport", "SignalingCrypto"]
        ),

        // ---- Durable store (issue 6): the SQLite EventStore ----------------------------
        // SQLite 3 (event storage). Debian: libsqlite3-dev.
        .systemLibrary(
            name: "CSQLite",
            pkgConfig: "sqlite3",
            providers: [.apt(["libsqlite3-dev"])]
        ),
        .target(
            name: "SignalingStoreSQLite",
            dependencies: ["SignalingStore", "CSQLite", "CLinuxShims", "SignalingSupport"]
        ),
        // Deterministic batches and an in-memory model of StoreChange, shared by the tests
        // and the crash-test helper (which must produce the same batches the test checks).
        .target(
            name: "SQLiteStoreFixtures",
            dependencies: ["SignalingStore", "SignalingProtocol"],
            path: "Tests/SQLiteStoreFixtures"
        ),
        // Runs a store in a child process for the kill -9 and permission tests.
        .executableTarget(
            name: "sqlite-store-test-helper",
            dependencies: ["SignalingStoreSQLite", "SQLiteStoreFixtures", "SignalingStore", "SignalingSupport"],
            path: "Tests/SQLiteStoreTestHelper"
        ),
        .testTarget(
            name: "SignalingStoreSQLiteTests",
            dependencies: [
                "SignalingStoreSQLite", "SignalingStore", "SignalingProtocol", "SignalingSupport", "CSQLite",
                "SQLiteStoreFixtures", "TestSupport",
            ]
        ),
        // Apply throughput of the SQLite store (release build; see docs/STORAGE.md).
        .executableTarget(
            name: "sqlite-store-bench",
            dependencies: ["SignalingStoreSQLite", "SignalingStore", "SignalingProtocol", "SignalingSupport"],
            path: "Tools/sqlite-store-bench"
        ),
        // Connect/disconnect cycles against a running server, printing its RSS: memory kept
        // per cycle shows up as growth (Tools/bench-connect-cycles).
        .executableTarget(
            name: "connect-cycles",
            dependencies: ["CLinuxShims", "SignalingProtocol", "SignalingSupport", "VoipLoadKit"],
            path: "Tools/connect-cycles"
        ),
        // Push latency of an MQTT broker and of voipserver measured with the same client-side
        // method, to calibrate what the machine and the method cost (Tools/bench-reference).
        .executableTarget(
            name: "reference-probe",
            dependencies: ["CLinuxShims", "SignalingProtocol", "SignalingSupport", "VoipLoadKit"],
            path: "Tools/reference-probe"
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
            dependencies: [
                "SignalingClient", "SignalingProtocol", "SignalingSupport", "CLinuxShims", "SignalingServer", "TestSupport",
                "SignalingCrypto",
            ]
        ),
        // --- end SignalingClient ---

        // --- voipclient (issue 4): the terminal for test calls and messages ---------------
        // The logic (options, scripted commands, interactive console and its line editor,
        // the UDP call-path probe) is a library so its parts can be unit-tested; the
        // executable only parses and runs. Built on SignalingClient's public API only.
        // See docs/VOIPCLIENT.md.
        .target(
            name: "VoipClientKit",
            dependencies: ["SignalingClient", "SignalingProtocol", "SignalingSupport", "SignalingCrypto"]
        ),
        .executableTarget(
            name: "voipclient",
            dependencies: ["VoipClientKit", "SignalingSupport"]
        ),
        .testTarget(
            name: "VoipClientTests",
            dependencies: ["VoipClientKit", "SignalingClient", "SignalingProtocol", "SignalingSupport", "TestSupport", "SignalingCrypto"]
        ),
        // --- end voipclient ---

        // ---- Service manager (issue 15): sd_notify for systemd's Type=notify ------------
        // libsystemd. Debian: libsystemd-dev. Only the server executable links it.
        .systemLibrary(
            name: "CSystemd",
            pkgConfig: "libsystemd",
            providers: [.apt(["libsystemd-dev"])]
        ),
        .target(name: "SignalingSystemd", dependencies: ["CSystemd"]),
        // --- end service manager ---
    ]
)
