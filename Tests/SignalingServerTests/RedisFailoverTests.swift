import SignalingProtocol
import SignalingSupport
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// Active/standby on one Redis database (docs/CLUSTER.md), with real `voipserver`
/// processes and a real `redis-server`: one node holds the lease and serves, the others
/// wait; a standby takes over when the active node dies, stops or loses Redis, and a device
/// that resumes on it gets everything acknowledged, with the same numbers, exactly once.
@Suite(
    "Redis failover: one active node per database, standbys take over (voipserver subprocesses)", .serialized,
    .enabled(if: RedisServer.isAvailable, "redis-server is not installed"))
struct RedisFailoverTests {
    func node(_ redis: RedisServer, ttl: String, standby: Bool = false, _ more: [String] = []) throws -> ServerProcess {
        try ServerProcess(["--store", redis.url(), "--redis-lease-ttl", ttl, "--admin-listen", "127.0.0.1:0"] + more,
                          until: standby ? "standby" : nil)
    }

    /// The admin port of the last `admin_listening` line after `offset`.
    func adminPort(_ server: ServerProcess, after offset: Int = 0) -> UInt16? {
        let text = String(decoding: Array(server.log.utf8.dropFirst(offset)), as: UTF8.self)
        return text.split(separator: "\n").reversed().lazy.compactMap { ServiceDeploymentTests.adminPort(in: String($0)) }.first
    }

    /// Bob's phone gets m1 (not acknowledged) and leaves; alice then sends m2 and m3. All
    /// three are acknowledged to alice, so all three must reach bob wherever he resumes.
    func prepareOfflineBob(on server: ServerProcess) throws -> (session: SessionID, firstSeq: UInt64, alice: TestClient) {
        let alice = try TestClient(port: server.port)
        try alice.hello(user: "alice", device: "laptop")
        let bob = try TestClient(port: server.port)
        let session = try bob.hello(user: "bob", device: "phone").sessionID
        #expect(try alice.request(1, Request.identifiedMessage("m1", to: "bob")).isOK)
        let (seq, event) = try bob.nextEvent()
        guard case .message(let first) = event, first.messageID == "m1" else { throw TestClient.Failure("expected m1, got \(event)") }
        #expect(try alice.request(2, Request.identifiedMessage("m2", to: "bob")).isOK)
        #expect(try alice.request(3, Request.identifiedMessage("m3", to: "bob")).isOK)
        return (session, seq, alice)
    }

    /// Bob resumes on `port` and must get exactly m1 (with its first number), m2, m3.
    func expectBobResumes(port: UInt16, session: SessionID, firstSeq: UInt64) throws {
        let bob = try TestClient(port: port)
        let welcome = try bob.hello(user: "bob", device: "phone", resume: ResumePoint(sessionID: session, lastReceivedSeq: 0))
        #expect(welcome.resumed, "the session was in Redis")
        var delivered: [(UInt64, String)] = []
        for _ in 1...3 {
            let (seq, event) = try bob.nextEvent(timeout: .seconds(10))
            if case .message(let message) = event { delivered.append((seq, message.messageID)) }
            try bob.ack(seq)
        }
        #expect(delivered.map(\.1) == ["m1", "m2", "m3"])
        #expect(delivered.first?.0 == firstSeq, "m1 keeps its number")
        #expect(delivered.map(\.0) == Array(firstSeq..<(firstSeq + 3)))
        #expect(try bob.staysSilent(for: .milliseconds(300)), "each message once")
    }

    @Test("a second node on the same Redis database stays a standby: no listener, /readyz 503 saying why, role in /metrics")
    func secondNodeIsStandby() throws {
        let redis = try RedisServer()
        let active = try node(redis, ttl: "30")
        let standby = try node(redis, ttl: "30", standby: true)
        #expect(!standby.log.contains("event=listening"))
        let port = try #require(adminPort(standby), "\(standby.log)")
        let ready = try HTTPRequest.send("GET", port: port, "/readyz")
        #expect(ready.status == 503)
        let reasons = ready.json?["reasons"] as? [String] ?? []
        #expect(reasons.count == 1 && reasons[0].hasPrefix("standby: the store lease is held by "), "\(ready.text)")
        #expect(try HTTPRequest.send("GET", port: port, "/healthz").status == 200)
        #expect(try HTTPRequest.send("GET", port: port, "/metrics").text.contains("voipserver_role{role=\"standby\"} 1"))
        #expect(try HTTPRequest.send("GET", port: port, "/v1/users/alice/devices").status == 503)

        let activePort = try #require(adminPort(active))
        #expect(try HTTPRequest.send("GET", port: activePort, "/readyz").status == 200)
        #expect(try HTTPRequest.send("GET", port: activePort, "/metrics").text.contains("voipserver_role{role=\"active\"} 1"))
        let device = try TestClient(port: active.port)
        try device.hello(user: "alice")
    }

    @Test("kill -9 of the active node: the standby takes over within the lease TTL, and a device resumes there with everything acknowledged, same numbers, once")
    func standbyTakesOverAfterKill() throws {
        let redis = try RedisServer()
        let active = try node(redis, ttl: "2")
        let standby = try node(redis, ttl: "2", standby: true)
        let (session, firstSeq, _) = try prepareOfflineBob(on: active)

        let clock = SystemClock()
        #expect(kill(active.process.pid, SIGKILL) == 0)
        let killed = clock.now()
        _ = active.process.waitForExit(timeoutSeconds: 10)
        let port = try #require(standby.listeningPort(timeoutSeconds: 30), "\(standby.log)")
        let takeover = clock.now() - killed
        // TTL 2 s, then at most one standby poll (200 ms) and the snapshot load.
        #expect(takeover < .seconds(8), "took over after \(takeover)")
        let admin = try #require(adminPort(standby))  // the active server's, logged before `listening`
        #expect(try HTTPRequest.send("GET", port: admin, "/readyz").status == 200)
        try expectBobResumes(port: port, session: session, firstSeq: firstSeq)
    }

    @Test("a clean shutdown releases the lease: the standby takes over at once, not after the TTL")
    func cleanShutdownReleases() throws {
        let redis = try RedisServer()
        let active = try node(redis, ttl: "120", ["--drain-timeout", "1"])
        let standby = try node(redis, ttl: "120", standby: true)
        let (session, firstSeq, _) = try prepareOfflineBob(on: active)
        #expect(active.terminate().map { ($0 >> 8) & 0xff } == 0)
        let clock = SystemClock()
        let stopped = clock.now()
        let port = try #require(standby.listeningPort(timeoutSeconds: 30), "a released lease is taken in well under its 120 s TTL")
        #expect(clock.now() - stopped < .seconds(20), "the standby took over \(clock.now() - stopped) after the stop, not after the TTL")
        try expectBobResumes(port: port, session: session, firstSeq: firstSeq)
    }

    @Test("an active node cut off from Redis closes its devices before its lease can expire; its late batch is refused, and it serves again from Redis")
    func cutOffNodeStepsDown() throws {
        let redis = try RedisServer()
        let server = try node(redis, ttl: "4", ["--store-timeout", "30"])
        let (session, firstSeq, alice) = try prepareOfflineBob(on: server)
        let carol = try TestClient(port: server.port)
        try carol.hello(user: "carol")
        let offset = server.log.utf8.count

        let clock = SystemClock()
        redis.pause()  // Redis stops answering: the node can neither refresh nor commit
        let cutOff = clock.now()
        defer { redis.resume() }
        // Its commit waits for a Redis that does not answer; when that Redis runs again,
        // the lease has expired, and the fencing check refuses the batch.
        try alice.send(.request(id: 9, Request.identifiedMessage("m-late", to: "bob")))
        let close = try carol.expectClose(timeout: .seconds(10))
        let closedAfter = clock.now() - cutOff
        #expect(close.code == .goingAway)
        #expect(closedAfter < .seconds(4), "the devices were closed \(closedAfter) after Redis stopped answering: the 4 s lease may have expired")
        #expect(try alice.expect(timeout: .seconds(10), "ERROR or CLOSE for m-late") { frame -> Bool? in
            switch frame {
            case .ok(9, _): return false
            case .error(9, _, _), .close: return true
            default: return nil
            }
        }, "m-late was never acknowledged")
        #expect(server.waitForLog("event=lease_lost", after: offset, timeoutSeconds: 1))

        // Past the lease's TTL on Redis's clock, Redis runs again: the late batch meets
        // the fencing check, and the node takes the free lease in a new term.
        clock.sleep(until: cutOff + .seconds(5))
        redis.resume()
        let port = try #require(server.listeningPort(after: offset, timeoutSeconds: 30), "\(server.log)")
        try expectBobResumes(port: port, session: session, firstSeq: firstSeq)
    }

    @Test("Redis killed and restarted: the active node keeps its lease (the AOF kept it) and loses nothing acknowledged")
    func redisRestartKeepsLease() throws {
        let redis = try RedisServer()
        let server = try node(redis, ttl: "10", ["--store-timeout", "1"])
        let (session, firstSeq, alice) = try prepareOfflineBob(on: server)
        redis.kill()
        try redis.start()
        let clock = SystemClock()
        let deadline = clock.now() + .seconds(20)
        var request: UInt32 = 10
        var accepted = false
        while !accepted && clock.now() < deadline {
            request += 1
            accepted = try alice.request(request, Request.identifiedMessage("after-\(request)", to: "carol")).isOK
            if !accepted { clock.sleep(until: clock.now() + .milliseconds(50)) }
        }
        #expect(accepted, "sends were still refused 20 s after Redis came back")
        #expect(!server.log.contains("event=lease_lost"), "\(server.log)")
        try expectBobResumes(port: server.port, session: session, firstSeq: firstSeq)
    }
}
