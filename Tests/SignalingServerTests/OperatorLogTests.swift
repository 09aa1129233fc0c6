import SignalingCrypto
import SignalingProtocol
import SignalingServer
import SignalingStore
import SignalingSupport
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// What an operator must see at warn or above: failed authentications (without a line
/// per attempt), dead peers the kernel gave up on, and a store that keeps failing
/// (without a `store_recovered`/`store_commit_failed` pair for every flap).
@Suite("Operator log lines")
struct OperatorLogTests {
    private func badHello(_ server: TestServer, user: String) throws -> CloseCode {
        let client = try server.client()
        try client.send(.hello(Hello(userID: user, deviceID: "d", credentials: Array(repeating: 0x30, count: 64))))
        return try client.expectClose().code
    }

    @Test("failed authentications are logged at warn, at most one line a second, with the count suppressed")
    func failedAuthentications() throws {
        let log = LogFile()
        let server = try TestServer(logger: log.logger) { $0.authSecret = "secret" }
        for index in 0..<5 {
            #expect(try badHello(server, user: "mallory\(index)") == .unauthorized)
        }
        let first = log.lines("auth_failed")
        #expect(first.count == 1, "\(first)")
        #expect(first.first.map { $0.contains("level=warn") && $0.contains("user=mallory0") && $0.contains("suppressed=0") } == true)

        server.clock.advance(by: .seconds(1))
        #expect(try badHello(server, user: "mallory5") == .unauthorized)
        let lines = log.lines("auth_failed")
        #expect(lines.count == 2 && lines[1].contains("user=mallory5") && lines[1].contains("suppressed=4"), "\(lines)")
        // A good token logs nothing.
        let client = try server.client()
        try client.send(.hello(Hello(userID: "alice", deviceID: "d", credentials: LegacyToken.make(secret: "secret", userID: "alice"))))
        guard case .welcome? = try client.next() else { Issue.record("no WELCOME"); return }
        #expect(log.lines("auth_failed").count == 2)
    }

    @Test("a request refused by a limit on another loop's shard (the recipient's backlog) is logged at warn, with its sender, by the sender's loop")
    func refusalDecidedOnAnotherLoop() throws {
        let log = LogFile()
        let server = try TestServer(workers: 2, logger: log.logger) {
            $0.maxPendingEvents = 1
            $0.maxPendingPerSender = 1
        }
        let alice = TwoShards.user("alice", onShard: 0), bob = TwoShards.user("bob", onShard: 1)
        let (sender, _) = try server.connect(user: alice)
        let (receiver, _) = try server.connect(user: bob)  // never acknowledges
        #expect(try sender.request(1, .identifiedMessage("m1", to: bob)).isOK)
        #expect(try sender.request(2, .identifiedMessage("m2", to: bob)).errorCode == .recipientBacklogFull)
        let lines = log.lines("request_refused")
        #expect(lines.count == 1 && lines.first.map { $0.contains("level=warn") && $0.contains("user=\(alice)") } == true, "\(lines)")
        _ = receiver
    }

    @Test("a peer dropped by TCP_USER_TIMEOUT (ETIMEDOUT) is logged at warn")
    func deadPeer() throws {
        let server = try ServerProcess(["--tcp-user-timeout", "1", "--store", "memory"])
        // bob's tiny receive window fills and he never reads: the server's data stays
        // unacknowledged (zero-window probes), and the kernel gives up after 1 s.
        let bob = try RawSocket(port: server.port, receiveWindow: 2048)
        try bob.send(.hello(Hello(userID: "bob", deviceID: "phone")))
        let alice = try RawSocket(port: server.port)
        try alice.send(.hello(Hello(userID: "alice", deviceID: "phone")))
        guard case .welcome? = try alice.next() else { Issue.record("no WELCOME"); return }
        for id in 1...6 as ClosedRange<UInt32> {
            let request = Request.messageSend(OutgoingMessage(
                messageID: "m\(id)", recipient: "bob", contentType: "application/octet-stream",
                body: Array(repeating: UInt8(id), count: 60_000)))
            #expect(try alice.request(id, request).isOK)
        }
        let deadline = SystemClock().now() + .seconds(30)
        while !server.log.contains("event=peer_timed_out") {
            guard SystemClock().now() < deadline else { Issue.record("no peer_timed_out line: \(server.log)"); return }
            usleep(20_000)
        }
        let line = server.log.split(separator: "\n").first { $0.contains("event=peer_timed_out") } ?? ""
        #expect(line.contains("level=warn") && line.contains("user=bob") && line.contains("tcp_user_timeout=1"), "\(line)")
        _ = bob
    }
}

@Suite("Store failure log")
struct StoreFailureLogTests {
    private func message(_ id: String) -> Request {
        .messageSend(OutgoingMessage(messageID: id, recipient: "bob", contentType: "text/plain", body: Array(id.utf8)))
    }

    @Test("a store that recovers and fails again by turns is logged as flapping, not as recovered/failed pairs")
    func flappingStore() throws {
        let log = LogFile()
        let store = ModelEventStore()
        let server = try TestServer(store: store, logger: log.logger) { $0.storeTimeout = .seconds(5) }
        let (alice, _) = try server.connect(user: "alice")
        _ = try server.connect(user: "bob")
        try server.waitFor("both devices to be stored") { _ in (try? store.loadSnapshot().devices.count) == 2 }
        #expect(try alice.request(100, message("warm-up")).isOK)

        for round in 1...4 as ClosedRange<UInt32> {
            let failed = store.failedAttempts
            store.failCommits(with: StoreError(.full, "database or disk is full"))
            try alice.send(.request(id: round, message("m\(round)")))
            try server.waitFor("a failed commit") { _ in store.failedAttempts > failed }
            store.failCommits(with: nil)
            #expect(try alice.reply(to: round).isOK)
        }
        let failures = log.lines("store_commit_failed")
        #expect(failures.filter { $0.contains("attempt=1 ") || $0.hasSuffix("attempt=1") }.count == 1, "\(failures)")
        #expect(failures.allSatisfy { $0.contains("level=error") })
        #expect(log.lines("store_recovered").count == 1, "\(log.lines("store_recovered"))")
        let flapping = log.lines("store_flapping")
        #expect(flapping.map { $0.contains("level=warn") } == [true, true], "\(flapping)")
        #expect(flapping.first?.contains("recoveries=1") == true && flapping.last?.contains("recoveries=2") == true)
    }

    @Test("failures are counted from the last successful commit: a store that keeps failing never starts again at attempt=1")
    func keepsFailing() throws {
        let log = LogFile()
        let store = ModelEventStore()
        let server = try TestServer(store: store, logger: log.logger) { $0.storeTimeout = .seconds(5) }
        let (alice, _) = try server.connect(user: "alice")
        _ = try server.connect(user: "bob")
        try server.waitFor("both devices to be stored") { _ in (try? store.loadSnapshot().devices.count) == 2 }
        #expect(try alice.request(100, message("warm-up")).isOK)
        store.failCommits(with: StoreError(.full, "database or disk is full"))
        for round in 1...3 as ClosedRange<UInt32> {
            let failed = store.failedAttempts
            try alice.send(.request(id: round, message("m\(round)")))
            try server.waitFor("a failed commit") { _ in store.failedAttempts > failed }
            // The store timeout passes: the message is refused and nothing is left to retry.
            server.clock.advance(by: .seconds(6))
            #expect(try alice.reply(to: round).errorCode == .storeUnavailable)
            // With nothing left to retry, the next message tries the store again.
            try server.waitFor("the store to be tried again") { $0.storeHealthy }
        }
        let failures = log.lines("store_commit_failed")
        #expect(failures.filter { $0.contains("attempt=1 ") || $0.hasSuffix("attempt=1") }.count == 1, "\(failures)")
        #expect(log.lines("store_recovered").isEmpty, "recovered without a successful commit")
    }
}
