import SignalingCrypto
import SignalingProtocol
import SignalingServer
import SignalingSupport
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// Device tokens (docs/AUTH.md) at the server: each refusal has its own CLOSE code on a
/// real socket, keys rotate by SIGHUP without dropping anyone, and what
/// `voipserver token` prints is accepted.
@Suite("Device tokens")
struct DeviceTokenTests {
    static let current = try! TokenKey(id: "k-current", secret: Array("current-secret-0123456789abcdef-0123".utf8))
    static let retired = try! TokenKey(id: "k-retired", secret: Array("retired-secret-0123456789abcdef-0123".utf8))
    /// The ManualClock's wall clock starts at 1,800,000,000,000 ms.
    static let now: Int64 = 1_800_000_000

    private func token(_ key: TokenKey, user: String = "alice", device: String? = "phone", expiresAt: Int64 = now + 3600) throws -> [UInt8] {
        Array(try DeviceToken.mint(DeviceTokenClaims(userID: user, deviceID: device, expiresAt: expiresAt), key: key).utf8)
    }

    private func refusal(_ server: TestServer, user: String = "alice", device: String = "phone", _ credentials: [UInt8]?) throws -> Close {
        let client = try server.client()
        try client.send(.hello(Hello(userID: user, deviceID: device, credentials: credentials)))
        return try client.expectClose()
    }

    @Test("expired, tampered, unknown-key, other-device and other-user tokens each get their own CLOSE; a valid one gets WELCOME")
    func eachRefusalHasItsCode() throws {
        let server = try TestServer { $0.authKeys = [Self.current] }

        let expired = try refusal(server, try token(Self.current, expiresAt: Self.now))
        #expect(expired.code == .tokenExpired && expired.action == .refreshCredentials && expired.retryJitterMs > 0)

        var tampered = try token(Self.current, user: "bob")
        let payload = Array(Base64URL.encode(Array("alice\nphone\n\(Self.now + 3600)".utf8)).utf8)
        let fields = tampered.split(separator: UInt8(ascii: "."), omittingEmptySubsequences: false)
        tampered = Array(fields[0]) + [0x2e] + Array(fields[1]) + [0x2e] + payload + [0x2e] + Array(fields[3])
        let badSignature = try refusal(server, tampered)
        #expect(badSignature.code == .badSignature && badSignature.action == .stop)

        let unknownKey = try refusal(server, try token(Self.retired))
        #expect(unknownKey.code == .unknownKey && unknownKey.action == .refreshCredentials && unknownKey.retryAfterMs >= 1000)

        let otherDevice = try refusal(server, device: "laptop", try token(Self.current))
        #expect(otherDevice.code == .wrongDevice && otherDevice.action == .stop)

        let otherUser = try refusal(server, user: "bob", try token(Self.current))
        #expect(otherUser.code == .unauthorized && otherUser.action == .stop)
        #expect(try refusal(server, nil).code == .unauthorized)
        #expect(try refusal(server, Array("not a token".utf8)).code == .unauthorized)

        let client = try server.client()
        #expect(try client.hello(user: "alice", device: "phone", credentials: try token(Self.current)).resumed == false)
        // A token for any device of the user serves each of them.
        let anyDevice = try token(Self.current, device: nil)
        for device in ["tablet", "laptop"] {
            #expect(try server.client().hello(user: "alice", device: device, credentials: anyDevice).keepAliveSeconds >= 600)
        }
    }

    @Test("a token is checked at the handshake: once it expires new handshakes are refused, the connection made with it stays")
    func expiryOnTheServerClock() throws {
        let server = try TestServer { $0.authKeys = [Self.current] }
        let credentials = try token(Self.current, expiresAt: Self.now + 60)
        let connected = try server.client()
        try connected.hello(user: "alice", device: "phone", credentials: credentials)
        try server.advance(by: .seconds(59))
        try server.client().hello(user: "alice", device: "tablet", credentials: try token(Self.current, device: nil, expiresAt: Self.now + 60))
        try server.advance(by: .seconds(1))
        #expect(try refusal(server, device: "laptop", try token(Self.current, device: "laptop", expiresAt: Self.now + 60)).code == .tokenExpired)
        try connected.send(.ping)
        #expect(try connected.next() == .pong)
    }

    @Test("device tokens and the legacy secret together: each kind is checked by its own rule")
    func legacyBeside() throws {
        let server = try TestServer {
            $0.authKeys = [Self.current]
            $0.authSecret = "legacy-secret"
        }
        try server.client().hello(user: "alice", device: "phone", credentials: try LegacyToken.make(secret: "legacy-secret", userID: "alice"))
        try server.client().hello(user: "alice", device: "tablet", credentials: try token(Self.current, device: "tablet"))
        #expect(try refusal(server, try LegacyToken.make(secret: "other", userID: "alice")).code == .unauthorized)
        #expect(try refusal(server, try token(Self.current, expiresAt: Self.now - 1)).code == .tokenExpired)
    }

    // MARK: The executable

    /// Waits (bounded) until the server's log has `count` lines containing `fragment`.
    private func waitForLog(_ server: ServerProcess, _ fragment: String, count: Int = 1) throws {
        let deadline = SystemClock().now() + .seconds(20)
        while server.log.components(separatedBy: "\n").filter({ $0.contains(fragment) }).count < count {
            guard SystemClock().now() < deadline, server.process.poll() == nil else {
                throw TestClient.Failure("no '\(fragment)' in the log (server running: \(server.process.poll() == nil)): \(server.log)")
            }
            usleep(5_000)
        }
    }

    private func keyLine(_ key: TokenKey) -> String { "\(key.id) \(String(decoding: key.secret, as: UTF8.self))\n" }

    private func wallNow() -> Int64 { Int64(SystemClock().wallMilliseconds() / 1000) }

    @Test("rotation by SIGHUP: a new key is accepted beside the old one; retiring the old one refuses its new handshakes, not its connections")
    func rotation() throws {
        let scratch = try TemporaryDirectory("token-rotation")
        let keyFile = scratch.file("keys")
        #expect(writeFile(keyFile, "# the key in use\n" + keyLine(Self.retired)))
        let server = try ServerProcess(["--auth-key-file", keyFile, "--store", "memory"])
        let expiresAt = wallNow() + 3600
        let old = try RawSocket(port: server.port)
        try old.hello(user: "alice", device: "phone", credentials: try token(Self.retired, expiresAt: expiresAt))
        let early = try RawSocket(port: server.port)
        try early.send(.hello(Hello(userID: "bob", deviceID: "phone", credentials: try token(Self.current, user: "bob", expiresAt: expiresAt))))
        #expect(try early.expectClose().code == .unknownKey, "a key is accepted before it was added")

        // Step 1: the new key is added; both are accepted.
        #expect(writeFile(keyFile, keyLine(Self.retired) + "k-current \(String(decoding: Self.current.secret, as: UTF8.self))   # new\n"))
        server.process.send(signal: SIGHUP)
        try waitForLog(server, "event=reloaded changed=auth-key-file")
        #expect(server.log.contains("auth=tokens(k-retired,k-current)"), "\(server.log)")
        let new = try RawSocket(port: server.port)
        try new.hello(user: "bob", device: "phone", credentials: try token(Self.current, user: "bob", expiresAt: expiresAt))
        try RawSocket(port: server.port).hello(user: "alice", device: "tablet", credentials: try token(Self.retired, device: "tablet", expiresAt: expiresAt))

        // Step 3: the old key is retired.
        #expect(writeFile(keyFile, keyLine(Self.current)))
        server.process.send(signal: SIGHUP)
        try waitForLog(server, "event=reloaded changed=auth-key-file", count: 2)
        let late = try RawSocket(port: server.port)
        try late.send(.hello(Hello(userID: "alice", deviceID: "laptop", credentials: try token(Self.retired, device: "laptop", expiresAt: expiresAt))))
        let refused = try late.expectClose()
        #expect(refused.code == .unknownKey && refused.action == .refreshCredentials)
        try RawSocket(port: server.port).hello(user: "alice", device: "laptop", credentials: try token(Self.current, device: "laptop", expiresAt: expiresAt))
        // Neither device connected before was dropped.
        for socket in [old, new] {
            try socket.send(.ping)
            #expect(try socket.next() == .pong)
        }
        #expect(server.process.poll() == nil, "SIGHUP ended the server: \(server.log)")
    }

    @Test("a key file that breaks the format keeps the running keys on SIGHUP")
    func badKeyFileOnReload() throws {
        let scratch = try TemporaryDirectory("token-bad-reload")
        let keyFile = scratch.file("keys")
        #expect(writeFile(keyFile, keyLine(Self.current)))
        let server = try ServerProcess(["--auth-key-file", keyFile, "--store", "memory"])
        #expect(writeFile(keyFile, "# everything commented out\n"))
        server.process.send(signal: SIGHUP)
        try waitForLog(server, "event=reload_failed")
        #expect(server.log.contains("no keys"), "\(server.log)")
        #expect(writeFile(keyFile, "k-short tooshort\n"))
        server.process.send(signal: SIGHUP)
        try waitForLog(server, "event=reload_failed", count: 2)
        #expect(server.log.contains("line 1: the secret of key 'k-short' is 8 bytes"), "\(server.log)")
        try RawSocket(port: server.port).hello(user: "alice", device: "phone", credentials: try token(Self.current, expiresAt: wallNow() + 60))
    }

    @Test("what voipserver token prints is accepted by a server with the same key file; its mistakes exit 64")
    func mintCommand() throws {
        let scratch = try TemporaryDirectory("token-mint")
        let keyFile = scratch.file("keys")
        #expect(writeFile(keyFile, keyLine(Self.retired) + keyLine(Self.current)))
        let server = try ServerProcess(["--auth-key-file", keyFile, "--store", "memory"])
        let before = wallNow()
        let run = try ExecutableRun.run("voipserver", ["token", "--user", "alice", "--device", "phone", "--ttl", "1h", "--key-file", keyFile], timeoutSeconds: 30)
        #expect(run.exitCode == 0, "\(run.stderr)")
        let minted = run.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(minted.hasPrefix("v1.k-current."), "the last key of the file signs by default: \(minted)")
        let claims = DeviceToken.split(Array(minted.utf8)).flatMap { DeviceToken.claims(ofPayload: $0.payload) }
        #expect(claims?.userID == "alice" && claims?.deviceID == "phone")
        #expect(claims.map { (before + 3600...wallNow() + 3600).contains($0.expiresAt) } == true)
        try RawSocket(port: server.port).hello(user: "alice", device: "phone", credentials: Array(minted.utf8))

        let anyDevice = try ExecutableRun.run("voipserver", ["token", "--user", "alice", "--key-file", keyFile, "--kid", "k-retired"], timeoutSeconds: 30)
        #expect(anyDevice.exitCode == 0 && anyDevice.stdout.hasPrefix("v1.k-retired."))
        try RawSocket(port: server.port).hello(user: "alice", device: "tablet", credentials: Array(anyDevice.stdout.trimmingCharacters(in: .newlines).utf8))

        for (arguments, message) in [
            (["--user", "alice"], "--key-file is required"),
            (["--user", "alice", "--key-file", keyFile, "--kid", "k-nope"], "has no key 'k-nope' (it has k-retired, k-current)"),
            (["--user", "alice", "--key-file", keyFile, "--ttl", "1w"], "--ttl expects N, Ns, Nm, Nh or Nd"),
            (["--key-file", keyFile], "--user is required"),
            (["--user", "", "--key-file", keyFile], "the user id must be 1-128 bytes"),
        ] {
            let failed = try ExecutableRun.run("voipserver", ["token"] + arguments, timeoutSeconds: 30)
            #expect(failed.exitCode == 64 && failed.stderr.contains(message) && failed.stdout.isEmpty, "\(arguments): \(failed.stderr)")
        }
    }

    @Test("a reload that would drop authentication from a listener beyond loopback keeps the running keys")
    func reloadKeepsAuthenticationBeyondLoopback() throws {
        var configuration = ServerConfiguration()
        configuration.host = "0.0.0.0"  // never started: nothing is bound
        configuration.port = 0
        configuration.authKeys = [Self.current]
        let log = LogFile()
        let server = try SignalingServer(configuration: configuration, clock: ManualClock(), logger: log.logger)
        var open = configuration
        open.authKeys = []
        #expect(server.reload(open).applied.isEmpty)
        #expect(server.configuration.authKeys == [Self.current])
        #expect(log.lines("reload_refused").count == 1)
        // With --allow-anonymous the operator asked for it.
        open.allowAnonymous = true
        #expect(server.reload(open).applied == ["auth-key-file"])
        #expect(log.lines("auth_disabled").count == 1)
    }

    // MARK: Safe defaults

    @Test("without authentication: loopback by default and said so; another address needs --allow-anonymous")
    func safeDefaults() throws {
        let (open, _) = try ServerOptions.configuration(from: [])
        #expect(open.host == "127.0.0.1" && open.port == 7443)
        let scratch = try TemporaryDirectory("token-defaults")
        let keyFile = scratch.file("keys")
        #expect(writeFile(keyFile, keyLine(Self.current)))
        let (authenticated, _) = try ServerOptions.configuration(from: ["--auth-key-file", keyFile])
        #expect(authenticated.host == "0.0.0.0" && authenticated.authKeys == [Self.current])
        let (legacy, _) = try ServerOptions.configuration(from: ["--auth-secret", "s"])
        #expect(legacy.host == "0.0.0.0")
        let (anonymous, _) = try ServerOptions.configuration(from: ["--listen", "0.0.0.0:7443", "--allow-anonymous"])
        #expect(anonymous.host == "0.0.0.0" && anonymous.allowAnonymous)
        // Alone, --allow-anonymous does not widen the default.
        #expect(try ServerOptions.configuration(from: ["--allow-anonymous"]).0.host == "127.0.0.1")

        // `allow-anonymous = false` in a file must not mean true.
        let configFile = scratch.file("voipserver.conf")
        #expect(writeFile(configFile, "listen = 0.0.0.0:7443\nallow-anonymous = false\n"))
        #expect(throws: UsageError.self) { try ServerOptions.configuration(from: ["--config", configFile]) }
        #expect(writeFile(configFile, "listen = 0.0.0.0:7443\nallow-anonymous = true\n"))
        #expect(try ServerOptions.configuration(from: ["--config", configFile]).0.allowAnonymous)

        // The executable refuses at once, before binding anything.
        let refused = try ExecutableRun.run("voipserver", ["--listen", "0.0.0.0:0", "--store", "memory"], timeoutSeconds: 30)
        #expect(refused.exitCode == 64 && refused.stderr.contains("--allow-anonymous"), "\(refused.stderr)")

        let server = try ServerProcess(["--store", "memory"])
        #expect(server.log.contains("event=auth_disabled") && server.log.contains("loopback only"), "\(server.log)")
        #expect(server.log.contains("auth=off"))
    }
}
