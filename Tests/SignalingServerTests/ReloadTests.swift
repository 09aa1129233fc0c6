import Foundation
import SignalingCrypto
import SignalingProtocol
import SignalingServer
import SignalingSupport
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// SIGHUP: the real executable reads its configuration again and puts what can change at
/// run time in force, without dropping anyone; a bad file changes nothing.
@Suite("Reloading on SIGHUP")
struct ReloadTests {
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

    /// A HELLO for `user` with the token made from `secret`: WELCOME or CLOSE.
    private func handshake(_ server: ServerProcess, user: String, secret: String) throws -> Frame? {
        let client = try RawSocket(port: server.port)
        try client.send(.hello(Hello(userID: user, deviceID: "phone", credentials: LegacyToken.make(secret: secret, userID: user))))
        return try client.next()
    }

    @Test("SIGHUP after rewriting the secret file: the old token is refused, the new one accepted, the server lives on")
    func secretFile() throws {
        let scratch = try TemporaryDirectory("reload-secret")
        let secretPath = scratch.file("secret")
        #expect(writeFile(secretPath, "first-secret\n"))
        let server = try ServerProcess(["--auth-secret-file", secretPath, "--store", "memory"])
        guard case .welcome? = try handshake(server, user: "alice", secret: "first-secret") else {
            Issue.record("the first secret is refused"); return
        }
        // A device connected before the reload keeps its connection.
        let connected = try RawSocket(port: server.port)
        try connected.send(.hello(Hello(userID: "bob", deviceID: "phone", credentials: LegacyToken.make(secret: "first-secret", userID: "bob"))))
        guard case .welcome? = try connected.next() else { Issue.record("no WELCOME for bob"); return }

        #expect(writeFile(secretPath, "second-secret\n"))
        server.process.send(signal: SIGHUP)
        try waitForLog(server, "event=reloaded changed=auth-secret")

        guard case .close(let close)? = try handshake(server, user: "alice", secret: "first-secret") else {
            Issue.record("the old secret is still accepted"); return
        }
        #expect(close.code == .unauthorized)
        guard case .welcome? = try handshake(server, user: "alice", secret: "second-secret") else {
            Issue.record("the new secret is refused"); return
        }
        try connected.send(.ping)
        #expect(try connected.next() == .pong)
        #expect(server.process.poll() == nil, "SIGHUP ended the server: \(server.log)")
        #expect(server.log.contains("event=signal signal=SIGHUP"))
        #expect(!server.log.contains("first-secret") && !server.log.contains("second-secret"), "a secret reached the log")
        #expect(server.terminate().map { ($0 >> 8) & 0xff } == 0)
    }

    @Test("SIGHUP after rotating the APNs key: the next provider token verifies only with the new key; a bad key file then keeps it")
    func apnsKeyRotation() throws {
        let pki = try PushTestPKI()
        let rotated = try pki.makeAPNsKey(named: "rotated")
        let mock = try MockPushService(pki: pki, moreAPNsPublicKeys: [rotated.publicKey])
        defer { mock.stop() }
        let keyFile = pki.directory.file("AuthKey_live.p8")
        #expect(writeFile(keyFile, try String(contentsOfFile: pki.apnsKeyFile, encoding: .utf8)))
        let server = try ServerProcess([
            "--store", "memory", "--apns-key-file", keyFile, "--apns-key-id", PushTestPKI.apnsKeyID,
            "--apns-team-id", PushTestPKI.apnsTeamID, "--apns-topic", "com.example.app", "--apns-url", mock.baseURL,
            "--apns-sandbox-url", mock.baseURL, "--push-ca-file", pki.caFile, "--push-interval", "0",
        ])
        do {
            let phone = try RawSocket(port: server.port)
            try phone.send(.hello(Hello(userID: "bob", deviceID: "phone", credentials: [])))
            guard case .welcome? = try phone.next() else { Issue.record("no WELCOME for bob"); return }
            try phone.send(.request(id: 1, .pushRegister(platform: "apns", token: [UInt8](repeating: 0xB2, count: 32))))
            guard case .ok(1, _)? = try phone.next() else { Issue.record("PUSH_REGISTER refused"); return }
        }
        let alice = try RawSocket(port: server.port)
        try alice.send(.hello(Hello(userID: "alice", deviceID: "laptop", credentials: [])))
        guard case .welcome? = try alice.next() else { Issue.record("no WELCOME for alice"); return }
        var sent = 0
        /// Messages the offline phone until the mock has one more push (the first may
        /// still find the phone's connection being closed), and returns that push.
        func nextPush() throws -> MockPushService.Request {
            let before = mock.requests.count
            for _ in 0..<20 {
                sent += 1
                try alice.send(.request(id: UInt32(100 + sent), .messageSend(OutgoingMessage(
                    messageID: "m\(sent)", recipient: "bob", contentType: "text/plain", body: Array("hi".utf8)))))
                if let pushes = try? mock.waitFor("a push", timeout: 1, { $0.count > before }) { return pushes[before] }
            }
            throw TestClient.Failure("no push for the offline phone: \(server.log)")
        }
        let first = try nextPush()
        #expect(first.auth == "ok" && first.apnsKey == 0)

        #expect(writeFile(keyFile, try String(contentsOfFile: rotated.privateKey, encoding: .utf8)))
        server.process.send(signal: SIGHUP)
        try waitForLog(server, "event=reloaded changed=apns-key-file")
        let second = try nextPush()
        #expect(second.auth == "ok" && second.apnsKey == 1, "signed with the new key at once, verifiable only with its public half")
        #expect(second.headers["authorization"] != first.headers["authorization"])

        #expect(writeFile(keyFile, "-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n"))
        server.process.send(signal: SIGHUP)
        try waitForLog(server, "level=error event=reload_refused keys=apns-key-file")
        try waitForLog(server, "event=reloaded changed=none")
        let third = try nextPush()
        #expect(third.auth == "ok" && third.apnsKey == 1, "a bad key file keeps the running key")
        #expect(third.headers["authorization"] == second.headers["authorization"], "and its provider token")
        #expect(!server.log.contains("reload_needs_restart"), "\(server.log)")
        #expect(server.process.poll() == nil, "SIGHUP ended the server: \(server.log)")
        #expect(server.terminate().map { ($0 >> 8) & 0xff } == 0)
    }

    @Test("a bad configuration file on SIGHUP is logged with file:line and the running configuration stays")
    func badFile() throws {
        let scratch = try TemporaryDirectory("reload-bad")
        let configPath = scratch.file("voipserver.conf")
        #expect(writeFile(configPath, "auth-secret = one#1\nlog-level = info\n"))
        let server = try ServerProcess(["--config", configPath, "--store", "memory"])
        #expect(writeFile(configPath, "auth-secret = two\nlog-level = info\nauth-secret = three\n"))
        server.process.send(signal: SIGHUP)
        try waitForLog(server, "event=reload_failed")
        #expect(server.log.contains("\(configPath):3: 'auth-secret' is already set on line 1"), "\(server.log)")
        guard case .welcome? = try handshake(server, user: "alice", secret: "one#1") else {
            Issue.record("a failed reload changed the secret"); return
        }

        // Fixed: the new secret and log level are in force, and a restart-only key is named.
        #expect(writeFile(configPath, "auth-secret = 'two'\nlog-level = debug\nworkers = 3\n"))
        server.process.send(signal: SIGHUP)
        try waitForLog(server, "event=reloaded changed=log-level,auth-secret")
        try waitForLog(server, "event=reload_needs_restart keys=workers")
        guard case .welcome? = try handshake(server, user: "carol", secret: "two") else {
            Issue.record("the reloaded secret is refused"); return
        }
        try waitForLog(server, "event=session")  // a debug line: the new level is in force
        #expect(server.process.poll() == nil)
    }
}

/// `SignalingServer.reload` on a library server: the limits it puts in force.
@Suite("Reloading limits")
struct ReloadLimitsTests {
    @Test("a lowered max-pending refuses the next message; a raised one accepts it again")
    func maxPending() throws {
        let server = try TestServer { $0.maxPendingEvents = 10 }
        let (sender, _) = try server.connect(user: "alice")
        _ = try server.connect(user: "bob")  // a device of bob's that never acknowledges
        let send = { (id: UInt32) throws -> Frame in
            try sender.request(id, .messageSend(OutgoingMessage(
                messageID: "m\(id)", recipient: "bob", contentType: "text/plain", body: Array("hi".utf8))))
        }
        guard case .ok = try send(1) else { Issue.record("first message refused"); return }
        var configuration = server.server.configuration
        configuration.maxPendingEvents = 1
        #expect(server.server.reload(configuration) == SignalingServer.Reload(applied: ["max-pending"]))
        guard case .error(_, let code, _) = try send(2) else { Issue.record("not refused after lowering max-pending"); return }
        #expect(code == .recipientBacklogFull)
        configuration.maxPendingEvents = 10
        server.server.reload(configuration)
        guard case .ok = try send(3) else { Issue.record("refused after raising max-pending"); return }
        #expect(server.server.configuration.maxPendingEvents == 10)
    }

    @Test("a lowered max-connections-per-ip refuses the next connection, and keeps those open")
    func maxConnectionsPerAddress() throws {
        let server = try TestServer()
        let (first, _) = try server.connect(user: "alice")
        var configuration = server.server.configuration
        configuration.maxConnectionsPerAddress = 1
        configuration.handshakeRate = 5
        let result = server.server.reload(configuration)
        #expect(result.applied == ["max-connections-per-ip", "handshake-rate"] && result.needRestart.isEmpty)
        let second = try server.client()
        #expect(try second.expectClose().code == .tooManyConnections)
        try first.send(.ping)
        #expect(try first.next() == .pong)
    }

    @Test("the sender limits and the memory budget take effect at the next message")
    func senderLimits() throws {
        let server = try TestServer()
        let (alice, _) = try server.connect(user: "alice")
        _ = try server.connect(user: "bob")
        var configuration = server.server.configuration
        configuration.maxPendingPerSender = 1
        configuration.senderRate = 100
        configuration.memoryBudget = 32 << 10
        #expect(server.server.reload(configuration).applied == ["max-pending-per-sender", "sender-rate", "memory-budget"])
        let message = { (id: UInt32, size: Int) in
            Request.messageSend(OutgoingMessage(messageID: "m\(id)", recipient: "bob", contentType: "t", body: [UInt8](repeating: 0, count: size)))
        }
        #expect(try alice.request(1, message(1, 10)).isOK)
        #expect(try alice.request(2, message(2, 10)).errorCode == .senderQuotaExceeded)
        #expect(try alice.request(3, .messageSend(OutgoingMessage(
            messageID: "big", recipient: "nobody", contentType: "t", body: [UInt8](repeating: 0, count: 60_000)))).errorCode
            == .capacityExceeded)
    }

    @Test("settings fixed at start are reported, not applied")
    func restartOnly() throws {
        let server = try TestServer()
        var configuration = server.server.configuration
        configuration.workers = 5
        configuration.ringTimeout = .seconds(5)
        let result = server.server.reload(configuration)
        #expect(result.applied.isEmpty)
        #expect(result.needRestart == ["workers", "ring-timeout"])
        #expect(server.server.configuration.workers == 2)
    }
}
