import SignalingProtocol
import SignalingSupport
import Testing
@testable import SignalingServer

// The timing rules of the loops (handshake deadline, keep-alive floor, idle timeout, call
// grace) over embedded loops (`EmbeddedServer`): the manual clock moves and the loops tick
// on the test's thread, with nothing to wait for. "Deadlines never fire early (real
// sockets, injected clock)" keeps the handshake and idle deadlines covered over sockets.

@Suite("Keep-alive negotiation (embedded loops)")
struct EmbeddedKeepAliveTests {
    @Test("a client asking for less than 600 s is refused with a clear message")
    func tooShort() throws {
        let server = try EmbeddedServer()
        let client = try server.client()
        try client.send(.hello(Hello(userID: "a", deviceID: "d", requestedKeepAliveSeconds: 599)))
        let close = try client.expectClose()
        #expect(close.code == .keepAliveTooShort)
        #expect(close.action == .stop)
        #expect(close.message.contains("600"))
    }

    @Test("requests of 600 s or more are granted up to the maximum", arguments: [
        (UInt32(0), UInt32(600)), (600, 600), (1200, 1200), (99_999, 3600),
    ])
    func granted(requested: UInt32, expected: UInt32) throws {
        let server = try EmbeddedServer()
        let welcome = try server.client().hello(user: "a", keepAlive: requested)
        #expect(welcome.keepAliveSeconds == expected)
        #expect(welcome.idleTimeoutSeconds == expected + expected / 2)
    }
}

@Suite("Idle timeout: 1.5 × keep-alive, never earlier (embedded loops)")
struct IdleTimeoutTests {
    @Test("a connection silent for less than 1.5 × the interval is kept; one silent longer is closed")
    func idleRule() throws {
        let server = try EmbeddedServer()
        let (client, welcome) = try server.connect(user: "alice")
        #expect(welcome.idleTimeoutSeconds == 900)
        server.advance(by: .seconds(899))
        #expect(client.isOpenAndQuiet, "closed before 1.5 × keep-alive")
        server.advance(by: .seconds(2))
        let close = try client.expectClose()
        #expect(close.code == .idleTimeout)
        #expect(close.action == .resume)
        #expect(server.statistics.idleTimeouts == 1)
    }

    @Test("a device that pings every 600 s is never dropped")
    func keepsSchedule() throws {
        let server = try EmbeddedServer()
        let (client, _) = try server.connect(user: "alice")
        for _ in 0..<5 {
            server.advance(by: .seconds(600))
            try client.send(.ping)
            #expect(try client.next() == .pong)
        }
        // Even a handler running late (the OS may delay it) is within the margin.
        server.advance(by: .seconds(890))
        #expect(client.isOpenAndQuiet)
        try client.send(.ping)
        #expect(try client.next() == .pong)
    }

    @Test("the server sends nothing at all to an idle device")
    func serverNeverPings() throws {
        let server = try EmbeddedServer()
        let (client, _) = try server.connect(user: "alice")
        server.advance(by: .seconds(600))
        server.advance(by: .seconds(200))
        #expect(client.staysSilent)
    }
}

/// Deadlines placed late in a second (x.9 s), checked just before and just after
/// (see "Deadlines never fire early (routing core, pure)").
@Suite("Deadlines never fire early (embedded loops)")
struct EmbeddedDeadlineTests {
    let offer = Array("v=0 offer".utf8)

    @Test("a client that never says HELLO is closed after the handshake timeout")
    func handshakeTimeout() throws {
        let server = try EmbeddedServer()
        let client = try server.client()
        #expect(server.statistics.openConnections == 1)
        server.advance(by: .seconds(5))
        #expect(client.isOpenAndQuiet)
        server.advance(by: .seconds(6))
        #expect(try client.expectClose().code == .handshakeTimeout)
    }

    @Test("idle timeout beyond the wheel's horizon: 3600 s keep-alive, closed at 5400 s, not at 900")
    func longIdleTimeout() throws {
        let server = try EmbeddedServer()
        let client = try server.client()
        #expect(try client.hello(user: "alice", keepAlive: 3600).idleTimeoutSeconds == 5400)
        server.advance(by: .seconds(950))
        #expect(client.isOpenAndQuiet, "closed at the wheel's horizon")
        server.advance(by: .seconds(4_449))
        #expect(client.isOpenAndQuiet, "closed before its idle timeout")
        server.advance(by: .seconds(2))
        #expect(try client.expectClose().code == .idleTimeout)
    }

    @Test("call grace through the loops: peerDisconnected comes 2 s after a loss at x.9 s, not before")
    func peerDisconnectedAfterGrace() throws {
        let server = try EmbeddedServer { $0.callGrace = .seconds(2) }
        let (bob, _) = try server.connect(user: "bob")
        do {
            let (alice, _) = try server.connect(user: "alice")
            _ = try alice.request(1, .callInvite(callID: "c1", callee: "bob", offer: offer))
            _ = try bob.nextEvent()
            server.advance(by: .milliseconds(900))
        }
        #expect(server.statistics.establishedConnections == 1)
        server.advance(by: .milliseconds(1_950))
        #expect(bob.staysSilent, "the callee was told before the grace ended")
        server.advance(by: .milliseconds(100))
        guard case .callEnded("c1", .peerDisconnected, "alice", _) = try bob.nextEvent().event else {
            Issue.record("callee not told"); return
        }
    }

    @Test("call grace through the loops: a resume 1.5 s into a 2 s grace keeps the call (loss at x.9 s)")
    func resumeLateInSecond() throws {
        let server = try EmbeddedServer { $0.callGrace = .seconds(2) }
        let (alice, bobWelcome) = try server.answeredCallThenCalleeLost(offer: offer, answer: offer) {
            server.advance(by: .milliseconds(900))
        }
        server.advance(by: .milliseconds(1_500))
        let bob = try server.client()
        _ = try bob.hello(user: "bob", resume: ResumePoint(sessionID: bobWelcome.sessionID, lastReceivedSeq: 1))
        server.advance(by: .seconds(5))
        #expect(alice.staysSilent)
        #expect(try bob.request(2, .callHangup(callID: "c1")).isOK, "the call was gone after the resume")
    }
}

@Suite("Timer memory is bounded by connection slots, not by connects (embedded loops)")
struct IdleWheelMemoryTests {
    @Test("connections that come and go leave at most one idle-timer entry per connection slot")
    func idleWheelBounded() throws {
        let server = try EmbeddedServer(workers: 1)
        for index in 0..<200 {
            let (client, _) = try server.connect(user: "u\(index % 7)")
            _ = client
        }
        #expect(server.statistics.openConnections == 0)
        #expect(server.idleWheelEntries <= 4, "\(server.idleWheelEntries) entries for 200 closed connections")
    }
}
