import SignalingProtocol
import SignalingServer
import SignalingSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

@Suite("Limits, storms and shutdown")
struct LimitsTests {
    @Test("handshakes beyond the admitted rate are told to retry after a jittered delay")
    func handshakeRate() throws {
        let server = try TestServer { $0.handshakeRate = 2 }
        _ = try server.connect(user: "u1")
        _ = try server.connect(user: "u2")
        let third = try server.client()
        try third.send(.hello(Hello(userID: "u3", deviceID: "d")))
        let close = try third.expectClose()
        #expect(close.code == .overloaded)
        #expect(close.action == .resume)
        #expect(close.retryAfterMs > 0 && close.retryJitterMs > 0)
        #expect(server.server.statistics.handshakesThrottled == 1)
        // Tokens come back with time (the manual clock drives the bucket too).
        try server.advance(by: .seconds(1))
        _ = try server.connect(user: "u3")
    }

    @Test("connections beyond the per-address cap are refused; other addresses are not affected")
    func perAddressCap() throws {
        let server = try TestServer { $0.maxConnectionsPerAddress = 2 }
        // Each is accepted (it has its WELCOME) before the next connects: loops accept in
        // parallel, so only then is the order certain.
        let a = try server.client(sourceAddress: "127.0.0.1")
        _ = try a.hello(user: "a")
        let b = try server.client(sourceAddress: "127.0.0.1")
        _ = try b.hello(user: "b")
        let c = try server.client(sourceAddress: "127.0.0.1")
        let close = try c.expectClose()
        #expect(close.code == .tooManyConnections)
        #expect(close.retryAfterMs >= 1000)
        _ = consume c
        _ = try server.client(sourceAddress: "127.0.0.2").hello(user: "other")
        // Closing one frees a place.
        _ = consume a
        try server.waitFor("the close to be counted") { $0.openConnections == 1 }
        _ = try server.client(sourceAddress: "127.0.0.1").hello(user: "again")
    }

    @Test("shutdown tells every client to go away and when to come back")
    func shutdownDrains() throws {
        let clock = ManualClock()
        var configuration = ServerConfiguration()
        configuration.host = "127.0.0.1"
        configuration.port = 0
        configuration.tickInterval = .milliseconds(5)
        configuration.drainRetryAfter = .seconds(2)
        configuration.drainJitter = .seconds(20)
        let server = try SignalingServer(configuration: configuration, clock: clock, logger: .silent)
        try server.start()
        let established = try TestClient(port: server.port)
        _ = try established.hello(user: "alice")
        let fresh = try TestClient(port: server.port)
        server.beginShutdown()
        for client in [established, fresh] {
            let close = try client.expectClose()
            #expect(close.code == .goingAway)
            #expect(close.action == .resume)
            #expect(close.retryAfterMs == 2000)
            #expect(close.retryJitterMs == 20000)
        }
        _ = consume established
        _ = consume fresh
        // Both clients closed after reading their CLOSE, so the server stops without
        // waiting for its drain timeout (the manual clock never moves here).
        server.waitUntilStopped()
        #expect(!server.isRunning)
        #expect(throws: (any Error).self) { try TestClient(port: server.port) }
    }

    @Test("thousands of idle connections, and an event still reaches one of them promptly")
    func manyIdleConnections() throws {
        let server = try TestServer()
        let count = 2000
        var clients: [TestClient] = []
        clients.reserveCapacity(count)
        // In waves of 200, as a device population ramps up, not one burst of 2,000
        // connects: this test is about holding many connections. With one burst, on a
        // loaded 2-core machine, a connection was now and then closed before its WELCOME
        // (about one run in ten; the cause is not pinned down).
        let wave = 200
        for start in stride(from: 0, to: count, by: wave) {
            for index in start..<min(count, start + wave) {
                // Spread over source addresses like real devices behind many networks.
                let client = try server.client(sourceAddress: "127.0.\(1 + index / 250).\(1 + index % 250)")
                try client.send(.hello(Hello(userID: "user\(index)", deviceID: "d")))
                clients.append(client)
            }
            // Generous: this is about correctness under many connections, not speed, and
            // the suite runs in parallel on a small shared machine.
            for index in start..<clients.count {
                let reply = try clients[index].next(timeout: .seconds(30))
                guard case .welcome? = reply else { Issue.record("handshake \(index) failed: \(String(describing: reply))"); return }
            }
        }
        #expect(server.server.statistics.establishedConnections == count)
        let (sender, _) = try server.connect(user: "sender")
        for target in [0, count / 2, count - 1] {
            _ = try sender.request(UInt32(target + 1), .messageSend(OutgoingMessage(
                messageID: "m\(target)", recipient: "user\(target)", contentType: "t", body: [])))
            guard case .message(let message) = try clients[target].nextEvent(timeout: .seconds(30)).event else {
                Issue.record("no delivery"); return
            }
            #expect(message.messageID == "m\(target)")
        }
        // Nobody else heard anything.
        #expect(try clients[1].staysSilent(for: .milliseconds(20)))
    }
}
