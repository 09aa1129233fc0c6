import SignalingProtocol
import SignalingSupport
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// The real `voipserver` with `--store redis://...` on a real `redis-server`: what the
/// server promises with its SQLite store holds with Redis too.
@Suite(
    "Store end to end (voipserver subprocess, Redis)", .serialized,
    .enabled(if: RedisServer.isAvailable, "redis-server is not installed"))
struct RedisStoreEndToEndTests {
    /// `count` Redis instances and the `--store` value that spreads the users over them.
    private func instances(_ count: Int) throws -> ([RedisServer], String) {
        let servers = try (0..<count).map { _ in try RedisServer() }
        return (servers, servers.map { $0.url() }.joined(separator: ","))
    }

    @Test("kill -9 of the server: an offline device's messages come back from Redis with the same sequence numbers",
          arguments: [1, 3])
    func offlineDeviceAcrossKill(redisInstances: Int) throws {
        let (servers, store) = try instances(redisInstances)
        defer { withExtendedLifetime(servers) {} }  // killed when released
        var firstSeq: UInt64 = 0
        let session: SessionID
        do {
            // A short lease: the server after the kill waits for it to expire (docs/CLUSTER.md).
            let server = try ServerProcess(["--store", store, "--redis-lease-ttl", "1"])
            let alice = try TestClient(port: server.port)
            try alice.hello(user: "alice", device: "laptop")
            do {
                let bob = try TestClient(port: server.port)
                session = try bob.hello(user: "bob", device: "phone").sessionID
                #expect(try alice.request(1, Request.identifiedMessage("m1", to: "bob")).isOK)
                let (seq, event) = try bob.nextEvent()
                guard case .message(let first) = event else { throw TestClient.Failure("expected m1, got \(event)") }
                #expect(first.messageID == "m1")
                firstSeq = seq  // seen, not acknowledged: bob's phone goes away
            }
            #expect(try alice.request(2, Request.identifiedMessage("m2", to: "bob")).isOK)
            #expect(try alice.request(3, Request.identifiedMessage("m3", to: "bob")).isOK)
            #expect(kill(server.process.pid, SIGKILL) == 0)
            _ = server.process.waitForExit(timeoutSeconds: 10)
        }

        let server = try ServerProcess(["--store", store])
        let bob = try TestClient(port: server.port)
        let welcome = try bob.hello(user: "bob", device: "phone", resume: ResumePoint(sessionID: session, lastReceivedSeq: 0))
        #expect(welcome.resumed, "the session was stored in Redis")
        var delivered: [(UInt64, String)] = []
        for _ in 1...3 {
            let (seq, event) = try bob.nextEvent()
            if case .message(let message) = event { delivered.append((seq, message.messageID)) }
            try bob.ack(seq)
        }
        #expect(delivered.map(\.1) == ["m1", "m2", "m3"])
        #expect(delivered.first?.0 == firstSeq, "m1 keeps its number")
        #expect(delivered.map(\.0) == delivered.map(\.0).sorted())
    }

    @Test("Redis stopped mid-run: sends are refused with storeUnavailable; restarted, they are accepted again and nothing accepted is lost",
          arguments: [1, 3])
    func redisOutage(redisInstances: Int) throws {
        let (servers, store) = try instances(redisInstances)
        let server = try ServerProcess(["--store", store, "--store-timeout", "1"])
        do {
            let bob = try TestClient(port: server.port)
            try bob.hello(user: "bob", device: "phone")
        }
        // The instance that holds bob's keys (the recipient's): his events cannot be stored.
        // With three, the hash places alice on the first (the lease's) and bob on the third,
        // so the message crosses instances and the lease stays up.
        func holdsBob(_ redis: RedisServer) -> Bool { (try? redis.cli(["EXISTS", "{u:bob}:devices"])) == "1" }
        #expect(eventually { servers.contains(where: holdsBob) })
        let redis = try #require(servers.first(where: holdsBob))
        let alice = try TestClient(port: server.port)
        try alice.hello(user: "alice", device: "laptop")
        var accepted: [String] = []
        var request: UInt32 = 0
        func send() throws -> Frame {
            request += 1
            let id = "m\(request)"
            let reply = try alice.request(request, Request.identifiedMessage(id, to: "bob"))
            if reply.isOK { accepted.append(id) }
            return reply
        }
        for _ in 1...5 { #expect(try send().isOK) }

        redis.kill()
        let clock = SystemClock()
        var deadline = clock.now() + .seconds(20)
        var refusal: Frame?
        while refusal == nil && clock.now() < deadline {
            let reply = try send()
            if !reply.isOK { refusal = reply }
        }
        #expect(refusal?.errorCode == .storeUnavailable, "\(String(describing: refusal))")
        #expect(server.log.contains("store_commit_failed"))

        try redis.start()
        deadline = clock.now() + .seconds(20)
        var recovered = false
        while !recovered && clock.now() < deadline {
            recovered = try send().isOK
            if !recovered { clock.sleep(until: clock.now() + .milliseconds(50)) }
        }
        #expect(recovered, "sends were still refused 20 s after Redis came back")

        // Everything accepted reaches bob, each once, also after a restart of the server.
        #expect(server.terminate().map { ($0 >> 8) & 0xff } == 0)
        let restarted = try ServerProcess(["--store", store])
        let bob = try TestClient(port: restarted.port)
        try bob.hello(user: "bob", device: "phone")
        var received: [String] = []
        while received.count < accepted.count {
            let (seq, event) = try bob.nextEvent(timeout: .seconds(10))
            if case .message(let message) = event { received.append(message.messageID) }
            try bob.ack(seq)
        }
        #expect(received == accepted)
    }

    @Test("voipserver refuses to start on a Redis without an AOF, unless told to accept it")
    func refusesVolatileRedis() throws {
        let redis = try RedisServer(settings: ["--appendonly", "no", "--save", ""])
        let run = try ExecutableRun.run("voipserver", ["--listen", "127.0.0.1:0", "--store", redis.url()], timeoutSeconds: 30)
        #expect(run.exitCode == 70)
        #expect(run.stderr.contains("appendonly no") && run.stderr.contains("--redis-allow-volatile"), "\(run.stderr)")
        let server = try ServerProcess(["--store", redis.url(), "--redis-allow-volatile"])
        #expect(server.log.contains("store_volatile"))
    }

    @Test("an instance added with voipserver store-rebalance: the server refuses the longer list until the move, then every device resumes with what it missed")
    func rebalanceToThreeInstances() throws {
        let (servers, store) = try instances(2)
        let added = try RedisServer()
        let grown = store + "," + added.url()
        let users = (0..<12).map { "user-\($0)" }
        var sessions: [String: SessionID] = [:]
        do {
            let server = try ServerProcess(["--store", store])
            for user in users {
                let device = try TestClient(port: server.port)
                sessions[user] = try device.hello(user: user, device: "phone").sessionID
            }
            let sender = try TestClient(port: server.port)
            try sender.hello(user: "sender", device: "laptop")
            var request: UInt32 = 0
            for user in users {
                for number in 1...2 {
                    request += 1
                    #expect(try sender.request(request, Request.identifiedMessage("\(user)-m\(number)", to: user)).isOK)
                }
            }
            #expect(server.terminate().map { ($0 >> 8) & 0xff } == 0)
        }
        let refused = try ExecutableRun.run("voipserver", ["--listen", "127.0.0.1:0", "--store", grown], timeoutSeconds: 30)
        #expect(refused.exitCode == 70, "the longer list does not match the data")

        let move = try ExecutableRun.run("voipserver", ["store-rebalance", "--from", store, "--to", grown], timeoutSeconds: 60)
        #expect(move.exitCode == 0, "\(move.stderr)")
        #expect(move.stdout.contains("moved "), "\(move.stdout)")
        #expect(users.contains { (try? added.cli(["EXISTS", "{u:\($0)}:devices"])) == "1" }, "some users now live on the new instance")

        let server = try ServerProcess(["--store", grown])
        for user in users {
            let device = try TestClient(port: server.port)
            let welcome = try device.hello(user: user, device: "phone", resume: ResumePoint(sessionID: sessions[user]!, lastReceivedSeq: 0))
            #expect(welcome.resumed, "\(user)'s session moved with it")
            var received: [String] = []
            while received.count < 2 {
                let (seq, event) = try device.nextEvent(timeout: .seconds(10))
                if case .message(let message) = event { received.append(message.messageID) }
                try device.ack(seq)
            }
            #expect(received == ["\(user)-m1", "\(user)-m2"])
        }
        withExtendedLifetime(servers) {}
    }
}
