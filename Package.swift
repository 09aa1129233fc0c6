// swift-tools-version:6.0
import PackageDescription

// Targets by role, from the bottom up: the Debian C libraries and the shims in front of
// them; the protocol and the small shared foundations (support, crypto); the store; the
// server and its executable; the client library; the tools (voipclient, voipload,
// benchmarks), each a library with a thin executable; and the tests with their helpers.
// docs/ARCHITECTURE.md draws the graph.
let package = Package(
    name: "voip-signaling",
    platforms: [.macOS(.v15)],
    products: [
        .library(name: "SignalingProtocol", targets: ["SignalingProtocol"]),
        .library(name: "SignalingServer", targets: ["SignalingServer"]),
        .library(name: "SignalingClient", targets: ["SignalingClient"]),
        .executable(name: "voipserver", targets: ["voipserver"]),
        .executable(name: "voipclient", targets: ["voipclient"]),
        .executable(name: "voipload", targets: ["voipload"]),
    ],
    targets: [
        // ---- C libraries from Debian, and the shims Swift calls them through -----------
        // libevent (event loops, timers, HTTP). Debian: libevent-dev.
        .systemLibrary(name: "CLibevent", pkgConfig: "libevent", providers: [.apt(["libevent-dev"])]),
        // SQLite 3 (the durable store). Debian: libsqlite3-dev.
        .systemLibrary(name: "CSQLite", pkgConfig: "sqlite3", providers: [.apt(["libsqlite3-dev"])]),
        // OpenSSL 3 (TLS, HMAC, random bytes). Debian: libssl-dev.
        .systemLibrary(name: "COpenSSL", pkgConfig: "openssl", providers: [.apt(["libssl-dev"])]),
        // hiredis (the Redis store's client, synchronous API; the node link's, asynchronous on
        // libevent through hiredis's adapter). Debian: libhiredis-dev.
        .systemLibrary(name: "CHiredis", pkgConfig: "hiredis", providers: [.apt(["libhiredis-dev"])]),
        // libcurl with HTTP/2 (nghttp2): the APNs and FCM providers' client. Debian:
        // libcurl4-openssl-dev.
        .systemLibrary(name: "CCurl", pkgConfig: "libcurl", providers: [.apt(["libcurl4-openssl-dev"])]),
        // libsystemd (sd_notify for Type=notify). Debian: libsystemd-dev. Only voipserver links it.
        .systemLibrary(name: "CSystemd", pkgConfig: "libsystemd", providers: [.apt(["libsystemd-dev"])]),
        // The libevent and libcrypto functions the Swift code uses, behind headers with no
        // system includes.
        .target(name: "CLibeventShims", dependencies: ["CLibevent"]),
        .target(name: "COpenSSLShims", dependencies: ["COpenSSL"]),
        .target(name: "CHiredisShims", dependencies: ["CHiredis", "CLibevent"]),
        .target(name: "CCurlShims", dependencies: ["CCurl"]),
        // Small C helpers for Linux APIs whose macros or structs Swift cannot import.
        .target(name: "CLinuxShims"),

        // ---- Protocol and foundations ---------------------------------------------------
        // The wire protocol: frames, codec, error and close codes. Pure Swift, no I/O.
        .target(name: "SignalingProtocol"),
        // Clocks, logging, command-line parsing, threads and child processes.
        .target(name: "SignalingSupport", dependencies: ["CLinuxShims"]),
        // HMAC-SHA256, constant-time comparison, random bytes; device tokens and their keys.
        .target(name: "SignalingCrypto", dependencies: ["COpenSSLShims"]),
        // TLS on non-blocking sockets (OpenSSL's libssl): contexts and connections driven by
        // the caller's readiness events, for the server's loops and the clients alike; the
        // client tools' shared TLS options (hence SignalingSupport, for the option parser).
        .target(name: "SignalingTLS", dependencies: ["COpenSSLShims", "SignalingSupport"]),

        // ---- Store ------------------------------------------------------------------------
        // What must survive a restart: the EventStore protocol and its record types.
        .target(name: "SignalingStore", dependencies: ["SignalingProtocol", "SignalingSupport"]),
        // The default store: SQLite in WAL mode, one transaction per group commit.
        .target(name: "SignalingStoreSQLite", dependencies: ["SignalingStore", "CSQLite", "CLinuxShims", "SignalingSupport"]),
        // The store in Redis (--store redis://...): per-user keys laid out for Redis Cluster,
        // one Lua script per batch; and the nodes' link over Redis pub/sub (RedisNodeLink), on
        // a libevent loop of its own.
        .target(
            name: "SignalingStoreRedis",
            dependencies: ["SignalingStore", "SignalingProtocol", "SignalingSupport", "CHiredisShims", "CLibeventShims", "CLinuxShims"]
        ),

        // ---- Server -----------------------------------------------------------------------
        // Push wake-ups: its own libevent loop sends them to APNs and FCM over HTTP/2
        // (libcurl) and to a webhook gateway; the server only calls `submit` (docs/PUSH.md).
        .target(
            name: "SignalingPush",
            dependencies: ["CLibeventShims", "CLinuxShims", "CCurlShims", "SignalingSupport", "SignalingStore", "SignalingCrypto"]
        ),
        // Event loops, connections, the routing core, the store writer, the admin API. It
        // knows the EventStore protocol only; the executable picks the store.
        //
        // Release builds check exclusive access statically only: the run-time checks of the
        // loops' and the routing core's class properties (`swift_beginAccess`, a thread-local
        // access set) were about 10 % of a loop's instructions per message
        // (docs/LOAD-TESTING.md, "The loop's instructions per message"). Debug builds, which
        // the tests run, keep them. The flag is unsafe to SwiftPM: a package that depends on
        // this one by version can use the client library, not this target.
        .target(
            name: "SignalingServer",
            dependencies: [
                "CLibeventShims", "CLinuxShims", "SignalingProtocol", "SignalingPush", "SignalingStore", "SignalingSupport",
                "SignalingCrypto", "SignalingTLS",
            ],
            swiftSettings: [.unsafeFlags(["-enforce-exclusivity=unchecked"], .when(configuration: .release))]
        ),
        // sd_notify for systemd's Type=notify.
        .target(name: "SignalingSystemd", dependencies: ["CSystemd"]),
        .executableTarget(
            name: "voipserver",
            dependencies: [
                "SignalingServer", "SignalingStore", "SignalingStoreSQLite", "SignalingStoreRedis", "SignalingSupport", "SignalingSystemd",
            ]
        ),

        // ---- Client library -----------------------------------------------------------------
        .target(name: "SignalingClient", dependencies: ["CLinuxShims", "SignalingProtocol", "SignalingSupport", "SignalingTLS"]),
        // The small executable the client tests run inside network namespaces.
        .executableTarget(name: "signaling-client-probe", dependencies: ["SignalingClient", "SignalingProtocol", "SignalingSupport"]),

        // ---- Tools --------------------------------------------------------------------------
        // voipclient, the terminal for test calls and messages (docs/VOIPCLIENT.md). The
        // logic is a library built on SignalingClient's public API only; the executable
        // only parses and runs.
        .target(name: "VoipClientKit", dependencies: ["SignalingClient", "SignalingProtocol", "SignalingSupport", "SignalingCrypto", "SignalingTLS"]),
        .executableTarget(name: "voipclient", dependencies: ["VoipClientKit", "SignalingSupport"]),
        // voipload, the load tool: the engine (worker loop, coordinator, histograms, /proc
        // readers) is a library so its parts can be unit-tested.
        .target(
            name: "VoipLoadKit",
            dependencies: ["CLinuxShims", "SignalingProtocol", "SignalingSupport", "SignalingCrypto", "SignalingTLS"],
            path: "Tools/voipload/VoipLoadKit"
        ),
        .executableTarget(name: "voipload", dependencies: ["VoipLoadKit", "SignalingSupport"], path: "Tools/voipload/Command"),
        // Push latency of an MQTT broker and of voipserver measured with the same client-side
        // method, to calibrate what the machine and the method cost (Tools/bench-reference).
        .executableTarget(
            name: "reference-probe",
            dependencies: ["CLinuxShims", "SignalingProtocol", "SignalingSupport", "VoipLoadKit"],
            path: "Tools/reference-probe"
        ),
        // Connect/disconnect cycles against a running server, printing its RSS
        // (Tools/bench-connect-cycles).
        .executableTarget(
            name: "connect-cycles",
            dependencies: ["CLinuxShims", "SignalingProtocol", "SignalingSupport", "VoipLoadKit"],
            path: "Tools/connect-cycles"
        ),
        // Apply throughput of the SQLite and the Redis store, and what each event costs
        // Redis (release build; docs/STORAGE.md).
        .executableTarget(
            name: "store-bench",
            dependencies: ["SignalingStoreSQLite", "SignalingStoreRedis", "SignalingStore", "SignalingProtocol", "SignalingSupport"],
            path: "Tools/store-bench"
        ),
        // Packets per second through the Redis node link, their cost in Redis commands and
        // bytes, and the round trip (release build; docs/CLUSTER.md).
        .executableTarget(
            name: "link-bench", dependencies: ["SignalingStoreRedis", "SignalingStore", "SignalingSupport"], path: "Tools/link-bench"
        ),
        // 10,000 wake-ups through the APNs provider to the local HTTP/2 mock over one
        // connection: requests/s, latency, CPU per wake-up (release build; docs/PUSH.md).
        .executableTarget(
            name: "push-bench", dependencies: ["SignalingPush", "SignalingStore", "SignalingCrypto", "SignalingSupport", "TestSupport"],
            path: "Tools/push-bench"
        ),
        // How long a fan-out holds its recipient's routing shard, in one hold and in chunks
        // (release build; docs/LOAD-TESTING.md).
        .executableTarget(name: "routing-bench", dependencies: ["SignalingServer"], path: "Tools/routing-bench"),
        // What checking a HELLO's credentials costs per core (release build; docs/AUTH.md).
        .executableTarget(name: "token-bench", dependencies: ["SignalingCrypto", "SignalingSupport"], path: "Tools/token-bench"),

        // ---- Tests and their helpers -------------------------------------------------------
        // Running the executables as real subprocesses, a model store, HTTP helpers.
        .target(
            name: "TestSupport", dependencies: ["SignalingSupport", "SignalingStore", "SQLiteStoreFixtures"],
            path: "Tests/TestSupport"
        ),
        // Deterministic batches and an in-memory model of StoreChange, shared by the tests
        // and the crash-test helper (which must produce the same batches the test checks).
        .target(name: "SQLiteStoreFixtures", dependencies: ["SignalingStore", "SignalingProtocol"], path: "Tests/SQLiteStoreFixtures"),
        // Runs a store in a child process for the kill -9 and permission tests.
        .executableTarget(
            name: "sqlite-store-test-helper",
            dependencies: ["SignalingStoreSQLite", "SQLiteStoreFixtures", "SignalingStore", "SignalingSupport"],
            path: "Tests/SQLiteStoreTestHelper"
        ),
        .testTarget(name: "SignalingProtocolTests", dependencies: ["SignalingProtocol"]),
        .testTarget(name: "SignalingSupportTests", dependencies: ["SignalingSupport"]),
        .testTarget(name: "SignalingTLSTests", dependencies: ["SignalingTLS", "TestSupport"]),
        .testTarget(
            name: "SignalingCryptoTests",
            dependencies: ["SignalingCrypto", "SignalingServer", "SignalingProtocol", "SignalingSupport", "TestSupport"]
        ),
        .testTarget(
            name: "SignalingStoreSQLiteTests",
            dependencies: [
                "SignalingStoreSQLite", "SignalingStore", "SignalingProtocol", "SignalingSupport", "CSQLite",
                "SQLiteStoreFixtures", "TestSupport",
            ]
        ),
        .testTarget(
            name: "SignalingStoreRedisTests",
            dependencies: ["SignalingStoreRedis", "SignalingStore", "SignalingProtocol", "SignalingSupport", "SQLiteStoreFixtures", "TestSupport"]
        ),
        .testTarget(
            name: "SignalingPushTests",
            dependencies: ["SignalingPush", "SignalingStore", "SignalingSupport", "SignalingCrypto", "TestSupport"]
        ),
        .testTarget(
            name: "SignalingServerTests",
            dependencies: [
                "SignalingServer", "SignalingProtocol", "SignalingPush", "SignalingStore", "SignalingSupport", "CLinuxShims",
                "TestSupport", "SignalingCrypto", "SignalingTLS",
                // The relay between a front and its home over a real Redis link (FrontOnRedisTests).
                "SignalingStoreRedis",
            ]
        ),
        .testTarget(
            name: "SignalingClientTests",
            dependencies: [
                "SignalingClient", "SignalingProtocol", "SignalingSupport", "CLinuxShims", "SignalingServer", "TestSupport",
                "SignalingCrypto", "SignalingPush", "SignalingTLS",
            ]
        ),
        .testTarget(
            name: "VoipClientTests",
            dependencies: [
                "VoipClientKit", "SignalingClient", "SignalingProtocol", "SignalingSupport", "TestSupport", "SignalingCrypto", "SignalingTLS",
            ]
        ),
        .testTarget(
            name: "VoipLoadTests",
            dependencies: [
                "VoipLoadKit", "CLinuxShims", "SignalingProtocol", "SignalingSupport", "TestSupport", "SignalingCrypto", "SignalingTLS",
            ]
        ),
    ]
)
