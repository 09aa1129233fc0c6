import SignalingProtocol
@testable import SignalingServer
import Testing

/// A text MESSAGE_SEND request.
private func message(_ id: String, to recipient: String, _ text: String = "hello") -> Request {
    .messageSend(OutgoingMessage(messageID: id, recipient: recipient, contentType: "text/plain", body: Array(text.utf8)))
}

@Suite("Messages, receipts and redelivery over real sockets")
struct MessageTests {
    @Test("a message reaches the recipient; accepted and delivered receipts reach the sender")
    func messageWithReceipts() throws {
        let server = try TestServer()
        let (alice, _) = try server.connect(user: "alice")
        let (bob, _) = try server.connect(user: "bob")
        let reply = try alice.request(7, message("m1", to: "bob"))
        guard case .ok(7, let serverTime) = reply else { Issue.record("not accepted: \(reply)"); return }
        #expect(serverTime == server.clock.wallMilliseconds())

        let (seq, event) = try bob.nextEvent()
        #expect(seq == 1)
        #expect(event == .message(DeliveredMessage(
            messageID: "m1", sender: "alice", senderDevice: "d1", recipient: "bob", contentType: "text/plain",
            body: Array("hello".utf8), serverTime: serverTime)))
        // No delivery receipt before the recipient acknowledges.
        #expect(try alice.staysSilent(for: .milliseconds(30)))
        try bob.ack(seq)
        guard case .messageDelivered("m1", "bob", "d1", _) = try alice.nextEvent().event else {
            Issue.record("no delivery receipt"); return
        }
    }

    @Test("unacknowledged events are re-sent when the device resumes on a new connection, and only those")
    func redeliveryAfterResume() throws {
        let server = try TestServer()
        let (alice, _) = try server.connect(user: "alice")
        var session: SessionID
        do {
            let (bob, welcome) = try server.connect(user: "bob")
            session = welcome.sessionID
            for index in 1...3 { _ = try alice.request(UInt32(index), message("m\(index)", to: "bob")) }
            for _ in 1...3 { _ = try bob.nextEvent() }
            try bob.ack(1)  // processed m1 only; m2 and m3 received but not acknowledged
        }
        try server.waitFor("bob's disconnect") { $0.establishedConnections == 1 }
        // Meanwhile, two more messages.
        _ = try alice.request(4, message("m4", to: "bob"))
        _ = try alice.request(5, message("m5", to: "bob"))

        let bob = try server.client()
        let welcome = try bob.hello(user: "bob", resume: ResumePoint(sessionID: session, lastReceivedSeq: 2))
        #expect(welcome.resumed)
        #expect(welcome.sessionID == session)
        var received: [UInt64: String] = [:]
        for _ in 0..<3 {
            let (seq, event) = try bob.nextEvent()
            if case .message(let message) = event { received[seq] = message.messageID }
        }
        // The resume point (2) counts as an acknowledgement: m2 is not sent again.
        #expect(received == [3: "m3", 4: "m4", 5: "m5"])
        #expect(try bob.staysSilent(for: .milliseconds(30)))
        session = welcome.sessionID
        _ = session
    }
}

/// The message rules (delivery, ACKs, receipts, de-duplication, sessions), over embedded
/// loops (`EmbeddedServer`); the suite above keeps them covered over real sockets.
@Suite("Messages, receipts and redelivery (embedded loops)")
struct EmbeddedMessageTests {
    @Test("a message fans out to every device of the recipient, each with its own receipt")
    func fanOut() throws {
        let server = try EmbeddedServer()
        let (alice, _) = try server.connect(user: "alice")
        let (phone, _) = try server.connect(user: "bob", device: "phone")
        let (tablet, _) = try server.connect(user: "bob", device: "tablet")
        #expect(try alice.request(1, message("m1", to: "bob")).isOK)
        let onPhone = try phone.nextEvent()
        let onTablet = try tablet.nextEvent()
        #expect(onPhone.event == onTablet.event)
        try phone.ack(onPhone.seq)
        try tablet.ack(onTablet.seq)
        var devices: Set<String> = []
        for _ in 0..<2 {
            if case .messageDelivered("m1", "bob", let device, _) = try alice.nextEvent().event { devices.insert(device) }
        }
        #expect(devices == ["phone", "tablet"])
    }

    @Test("a repeated message id is accepted again with the original time and delivered once")
    func deduplication() throws {
        let server = try EmbeddedServer()
        let (alice, _) = try server.connect(user: "alice")
        let (bob, _) = try server.connect(user: "bob")
        guard case .ok(_, let first) = try alice.request(1, message("m1", to: "bob")) else { Issue.record("refused"); return }
        server.advance(by: .seconds(3))
        guard case .ok(_, let second) = try alice.request(2, message("m1", to: "bob")) else { Issue.record("refused"); return }
        #expect(first == second)
        _ = try bob.nextEvent()
        #expect(bob.staysSilent)
    }

    @Test("a new session (no resume point) gets every unacknowledged event with its original number")
    func freshSessionGetsPending() throws {
        let server = try EmbeddedServer()
        let (alice, _) = try server.connect(user: "alice")
        do {
            let (bob, _) = try server.connect(user: "bob")
            _ = try alice.request(1, message("m1", to: "bob"))
            _ = try bob.nextEvent()
        }
        #expect(server.statistics.establishedConnections == 1)
        let (bob, welcome) = try server.connect(user: "bob")
        #expect(!welcome.resumed)
        #expect(welcome.ackedSeq == 0)
        let (seq, event) = try bob.nextEvent()
        #expect(seq == 1)
        guard case .message(let message) = event else { Issue.record("wrong event"); return }
        #expect(message.messageID == "m1")
    }

    @Test("resume with an unknown session or an impossible sequence number is refused and leaks nothing")
    func badResume() throws {
        let server = try EmbeddedServer()
        let (alice, _) = try server.connect(user: "alice")
        let session: SessionID
        do {
            let (bob, welcome) = try server.connect(user: "bob")
            session = welcome.sessionID
            _ = try alice.request(1, message("m1", to: "bob"))
            _ = try bob.nextEvent()
        }
        #expect(server.statistics.establishedConnections == 1)

        let unknown = try server.client()
        try unknown.send(.hello(Hello(userID: "bob", deviceID: "d1", resume: ResumePoint(sessionID: .random(), lastReceivedSeq: 0))))
        let unknownClose = try unknown.expectClose()
        #expect(unknownClose.code == .sessionUnknown)
        #expect(unknownClose.action == .fresh)

        let beyond = try server.client()
        try beyond.send(.hello(Hello(userID: "bob", deviceID: "d1", resume: ResumePoint(sessionID: session, lastReceivedSeq: 2))))
        #expect(try beyond.expectClose().code == .invalidSequence)

        // Other users' ids are not sessions either.
        let stranger = try server.client()
        try stranger.send(.hello(Hello(userID: "eve", deviceID: "d1", resume: ResumePoint(sessionID: session, lastReceivedSeq: 0))))
        #expect(try stranger.expectClose().code == .sessionUnknown)

        // Nothing changed: the real device resumes and still gets its event.
        let bob = try server.client()
        #expect(try bob.hello(user: "bob", resume: ResumePoint(sessionID: session, lastReceivedSeq: 0)).resumed)
        #expect(try bob.nextEvent().seq == 1)
    }

    @Test("an ACK beyond what was sent closes the connection")
    func ackBeyondSent() throws {
        let server = try EmbeddedServer()
        let (bob, _) = try server.connect(user: "bob")
        try bob.ack(5)
        let close = try bob.expectClose()
        #expect(close.code == .invalidSequence)
        #expect(close.action == .fresh)
    }

    @Test("a second connection of the same device takes over; the first is told not to reconnect")
    func takeover() throws {
        let server = try EmbeddedServer()
        let (alice, _) = try server.connect(user: "alice")
        let (first, _) = try server.connect(user: "bob")
        _ = try alice.request(1, message("m1", to: "bob"))
        _ = try first.nextEvent()  // received, never acknowledged
        let (second, _) = try server.connect(user: "bob")
        let close = try first.expectClose()
        #expect(close.code == .replaced)
        #expect(close.action == .stop)
        // The pending event moved to the new connection, and new ones follow it there.
        #expect(try second.nextEvent().seq == 1)
        _ = try alice.request(2, message("m2", to: "bob"))
        #expect(try second.nextEvent().seq == 2)
    }

    @Test("messages to a user with no known device wait for its first device, in order")
    func heldForFirstDevice() throws {
        let server = try EmbeddedServer()
        let (alice, _) = try server.connect(user: "alice")
        for index in 1...5 { #expect(try alice.request(UInt32(index), message("m\(index)", to: "newbie")).isOK) }
        let (newbie, _) = try server.connect(user: "newbie")
        #expect(try newbie.nextMessageIDs(5) == ["m1", "m2", "m3", "m4", "m5"])
        for _ in 1...5 {
            guard case .messageDelivered = try alice.nextEvent().event else { Issue.record("missing receipt"); return }
        }
    }

    @Test("a device with too many unacknowledged events makes the sender retry later; nothing is half-queued")
    func backlogFull() throws {
        let server = try EmbeddedServer {
            $0.maxPendingEvents = 3
            $0.maxPendingPerSender = 3  // one sender may fill the queue here
        }
        let (alice, _) = try server.connect(user: "alice")
        let (phone, _) = try server.connect(user: "bob", device: "phone")
        let (tablet, _) = try server.connect(user: "bob", device: "tablet")
        for index in 1...3 { #expect(try alice.request(UInt32(index), message("m\(index)", to: "bob")).isOK) }
        for _ in 1...3 {
            let (seq, _) = try tablet.nextEvent()
            try tablet.ack(seq)
        }
        let refused = try alice.request(4, message("m4", to: "bob"))
        #expect(refused.errorCode == .recipientBacklogFull)
        #expect(refused.errorCode?.isRetryable == true)
        // The tablet (which had room) did not get m4 either.
        try expectReceipts(alice, from: "tablet", count: 3)
        #expect(tablet.staysSilent)
        // Once the phone catches up (its receipts show the server has its ACK), the retry
        // succeeds.
        for _ in 1...3 { _ = try phone.nextEvent() }
        try phone.ack(3)
        try expectReceipts(alice, from: "phone", count: 3)
        #expect(try alice.request(5, message("m4", to: "bob")).isOK)
    }

    /// Reads and acknowledges `count` delivery receipts for `device`.
    private func expectReceipts(_ client: EmbeddedClient, from device: String, count: Int) throws {
        for _ in 0..<count {
            let (seq, event) = try client.nextEvent()
            guard case .messageDelivered(_, _, let recipientDevice, _) = event, recipientDevice == device else {
                Issue.record("expected a receipt from \(device), got \(event)")
                return
            }
            try client.ack(seq)
        }
        // A PING is answered after the ACKs before it were handled: the queue has room again.
        try client.send(.ping)
        try client.expect("PONG") { $0 == .pong ? true : nil }
    }

    @Test("a disconnected session stays resumable for the session TTL, then is forgotten")
    func sessionExpiry() throws {
        let server = try EmbeddedServer { $0.sessionTTL = .seconds(3600) }
        let session: SessionID
        do {
            let (bob, welcome) = try server.connect(user: "bob")
            session = welcome.sessionID
            _ = bob
        }
        #expect(server.statistics.establishedConnections == 0)
        server.advance(by: .seconds(3599))
        do {
            let bob = try server.client()
            #expect(try bob.hello(user: "bob", resume: ResumePoint(sessionID: session, lastReceivedSeq: 0)).resumed)
        }
        #expect(server.statistics.establishedConnections == 0)
        server.advance(by: .seconds(3601))
        #expect(server.statistics.sessionsExpired == 1)
        let late = try server.client()
        try late.send(.hello(Hello(userID: "bob", deviceID: "d1", resume: ResumePoint(sessionID: session, lastReceivedSeq: 0))))
        #expect(try late.expectClose().code == .sessionUnknown)
    }
}
