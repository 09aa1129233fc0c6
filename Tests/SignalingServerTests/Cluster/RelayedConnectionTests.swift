import SignalingProtocol
@testable import SignalingServer
import SignalingSupport
import Testing

private func message(_ id: String, to recipient: String, _ text: String = "hello") -> Request {
    .messageSend(OutgoingMessage(messageID: id, recipient: recipient, contentType: "text/plain", body: Array(text.utf8)))
}

@Suite("Relayed connections on the routing node (a test plays the front)")
struct RelayedConnectionTests {
    @Test("HELLO over a relay is answered with WELCOME, and the connection counts as relayed")
    func handshakeOverRelay() throws {
        let bed = try RelayTestBed()
        let (device, welcome) = try bed.connectRelayed(user: "alice")
        #expect(!welcome.resumed)
        #expect(device.ending == nil)
        try bed.home.waitFor("the relayed connection") { $0.relayedConnections == 1 && $0.establishedConnections == 1 }
        try device.send(.ping)
        #expect(try device.next() == .pong)
    }

    @Test("a message from a socket device reaches a relayed device, its receipts come back, and the reverse")
    func messageBetweenSocketAndRelay() throws {
        let bed = try RelayTestBed()
        let (alice, _) = try bed.home.connect(user: "alice")
        let (bob, _) = try bed.connectRelayed(user: "bob")

        guard case .ok(1, _) = try alice.request(1, message("m1", to: "bob")) else { Issue.record("not accepted"); return }
        let (seq, event) = try bob.nextEvent()
        guard case .message(let delivered) = event else { Issue.record("expected a message, got \(event)"); return }
        #expect(delivered.messageID == "m1" && delivered.sender == "alice" && delivered.body == Array("hello".utf8))
        try bob.ack(seq)
        guard case .messageDelivered("m1", "bob", "d1", _) = try alice.nextEvent().event else {
            Issue.record("no delivery receipt"); return
        }

        guard case .ok(1, _) = try bob.request(1, message("m2", to: "alice", "back")) else { Issue.record("not accepted"); return }
        let (aliceSeq, back) = try alice.nextEvent()
        guard case .message(let reply) = back else { Issue.record("expected a message, got \(back)"); return }
        #expect(reply.messageID == "m2" && reply.sender == "bob" && reply.body == Array("back".utf8))
        try alice.ack(aliceSeq)
        guard case .messageDelivered("m2", "alice", "d1", _) = try bob.nextEvent().event else {
            Issue.record("no delivery receipt for the relayed sender"); return
        }
    }

    @Test("a call between a relayed caller and a socket callee: invite, ringing, accept, hang-up")
    func callFromRelayToSocket() throws {
        let bed = try RelayTestBed()
        let offer = Array("v=0 offer".utf8)
        let answer = Array("v=0 answer".utf8)
        let (alice, _) = try bed.connectRelayed(user: "alice")
        let (bob, _) = try bed.home.connect(user: "bob")

        _ = try playFullCall(from: alice, to: bob, offer: offer, answer: answer)
    }

    @Test("a socket connection of a device replaces its relayed one (CLOSE replaced, then finish), and the reverse")
    func takeoverBothWays() throws {
        let bed = try RelayTestBed()
        let (relayed, _) = try bed.connectRelayed(user: "alice")
        let (socket, _) = try bed.home.connect(user: "alice")
        let close = try relayed.expectClose()
        #expect(close.code == .replaced)
        #expect(try relayed.awaitEnding() == .finish)

        let (again, _) = try bed.connectRelayed(user: "alice")
        #expect(try socket.expectClose().code == .replaced)
        try again.send(.ping)
        #expect(try again.next() == .pong)
        // The replaced relayed connection is released after its linger, with no frame
        // after its finish.
        try bed.home.advance(by: .seconds(3))
        try bed.home.waitFor("the first relayed connection's release") { $0.relayedConnections == 1 }
        #expect(bed.front.framesAfterEnd(of: relayed.connection) == 0)
    }

    @Test("a relayed connection that stays silent past its idle timeout gets CLOSE idleTimeout, then finish")
    func idleTimeout() throws {
        let bed = try RelayTestBed()
        let (device, welcome) = try bed.connectRelayed(user: "alice")
        try bed.home.advance(by: .seconds(Int64(welcome.idleTimeoutSeconds) - 1))
        #expect(device.ending == nil)
        try bed.home.advance(by: .seconds(3))
        #expect(try device.expectClose().code == .idleTimeout)
        #expect(try device.awaitEnding() == .finish)
    }

    @Test("a relayed connection with no HELLO within the handshake timeout gets CLOSE handshakeTimeout")
    func handshakeTimeout() throws {
        let bed = try RelayTestBed()
        let device = bed.front.open()
        try bed.home.waitFor("the relayed connection") { $0.relayedConnections == 1 }
        try bed.home.advance(by: .seconds(11))
        #expect(try device.expectClose().code == .handshakeTimeout)
    }

    /// Bob, relayed, loses his connection to `cut`; a message to him is then stored, and
    /// delivered when he connects again (here over a socket).
    private func offlineAfter(_ cut: (RelayTestBed) -> Void) throws {
        let bed = try RelayTestBed()
        let (alice, _) = try bed.home.connect(user: "alice")
        let (bob, welcome) = try bed.connectRelayed(user: "bob")
        try bed.home.waitFor("bob's relayed connection") { $0.establishedConnections == 2 }
        cut(bed)
        try bed.home.waitFor("bob's relayed connection to close") { $0.establishedConnections == 1 && $0.relayedConnections == 0 }
        // As if the device had disconnected (docs/CLUSTER.md, "Failures"): no CLOSE is written.
        // How the stream ends may race the cut: nothing (the front forgot it), a release, or,
        // under load, a finish after what the home had queued (CI saw one once).
        while let frame = try? bob.read(timeout: .milliseconds(50)) {
            if case .close = frame { Issue.record("a CLOSE for a device that went away with its front: \(frame)") }
        }
        #expect(try alice.request(1, message("m1", to: "bob")).isOK)
        try expectKeptForResume(bed, session: welcome.sessionID)
    }

    /// Bob connects again over a socket, resuming `session`, and gets m1: it was kept for him.
    private func expectKeptForResume(_ bed: RelayTestBed, session: SessionID) throws {
        let socket = try bed.home.client()
        #expect(try socket.hello(user: "bob", resume: ResumePoint(sessionID: session, lastReceivedSeq: 0)).resumed)
        let (_, event) = try socket.nextEvent()
        guard case .message(let delivered) = event else { Issue.record("expected the kept message, got \(event)"); return }
        #expect(delivered.messageID == "m1")
    }

    @Test("a front's reset makes its relayed devices offline: a message is stored and delivered on the next connection")
    func resetMakesOffline() throws {
        try offlineAfter { $0.front.send([.reset]) }
    }

    @Test("a front whose presence expired is gone after the presence interval: its devices are offline")
    func goneFrontMakesOffline() throws {
        try offlineAfter { bed in
            bed.bus.expire(bed.front.link.nodeID)
            // The presence interval (the lease TTL, 10 s by default) on the server clock.
            try? bed.home.advance(by: .seconds(11))
            try? bed.home.advance(by: .seconds(11))
        }
    }

    @Test("the home's link going down makes every relayed device offline")
    func linkDownMakesOffline() throws {
        try offlineAfter { bed in
            bed.bus.cut(bed.homeLink)
            bed.bus.restore(bed.homeLink)
        }
    }

    @Test("a front that no longer listens (packets to it undeliverable) loses its devices; what was sent stays pending")
    func undeliverableFront() throws {
        let bed = try RelayTestBed()
        let (alice, _) = try bed.home.connect(user: "alice")
        let (bob, welcome) = try bed.connectRelayed(user: "bob")
        try bed.home.waitFor("bob's relayed connection") { $0.establishedConnections == 2 }
        bed.front.link.stopListening(as: bed.front.link.nodeID)
        // The event for bob goes to a front nobody listens as: bob is offline from then on.
        #expect(try alice.request(1, message("m1", to: "bob")).isOK)
        try bed.home.waitFor("bob's relayed connection to close") { $0.relayedConnections == 0 && $0.establishedConnections == 1 }
        #expect(bob.ending == nil)
        try expectKeptForResume(bed, session: welcome.sessionID)
    }

    @Test("random relay packets never crash the home nor hurt a connection they do not name")
    func randomPackets() throws {
        let bed = try RelayTestBed()
        let (alice, _) = try bed.connectRelayed(user: "alice")
        let (bob, _) = try bed.home.connect(user: "bob")
        var random = SystemRandomNumberGenerator()
        for round in 0..<300 {
            let connection = UInt64.random(in: 1_000...1_010, using: &random)
            let bytes = (0..<Int.random(in: 0...40, using: &random)).map { _ in UInt8.random(in: 0...255, using: &random) }
            switch round % 5 {
            case 0: bed.front.send([.open(connection: connection, peer: "198.51.100.\(round % 200):1", tls: false)])
            case 1: bed.front.send([.data(connection: connection, bytes: bytes)])
            case 2: bed.front.send([.closed(connection: connection), .release(connection: connection)])
            case 3: bed.front.link.send(bytes, to: bed.homeLink.nodeID)  // not a packet at all
            default:
                var packet = RelayPacket(from: bed.front.link.nodeID, frames: [.data(connection: connection, bytes: bytes)]).encoded()
                packet[Int.random(in: 0..<packet.count, using: &random)] ^= 0xFF
                bed.front.link.send(packet, to: bed.homeLink.nodeID)
            }
        }
        #expect(try alice.request(1, message("m1", to: "bob")).isOK)
        let (seq, _) = try bob.nextEvent()
        try bob.ack(seq)
        guard case .messageDelivered("m1", "bob", _, _) = try alice.nextEvent().event else { Issue.record("no receipt"); return }
        #expect(alice.ending == nil)
    }

    @Test("a malformed packet is dropped; the other relayed and socket connections keep working")
    func malformedPacket() throws {
        let bed = try RelayTestBed()
        let (alice, _) = try bed.connectRelayed(user: "alice")
        let (bob, _) = try bed.home.connect(user: "bob")
        var garbage = RelayPacket(from: bed.front.link.nodeID, frames: [.data(connection: alice.connection, bytes: [1, 2, 3, 4])]).encoded()
        garbage.removeLast(2)  // cut short
        bed.front.link.send(garbage, to: bed.homeLink.nodeID)
        bed.front.link.send([9, 9, 9], to: bed.homeLink.nodeID)  // another version
        // A home's frame sent by a front, and data for a connection never opened.
        bed.front.send([.finish(connection: alice.connection), .data(connection: 999, bytes: [0, 0, 0, 1])])
        #expect(try alice.request(1, message("m1", to: "bob")).isOK)
        let (seq, _) = try bob.nextEvent()
        try bob.ack(seq)
        try alice.send(.ping)
        #expect(try alice.expect { $0 == .pong ? true : nil })
        #expect(alice.ending == nil)
    }

    @Test("with two loops, relayed connections moved to their user's home loop keep the order of their bytes")
    func byteOrderAcrossHandOver() throws {
        let bed = try RelayTestBed(workers: 2)
        // Two devices of one user, opened round the loops: one of them is not on the
        // user's home loop and moves there after its HELLO.
        let devices = [bed.front.open(), bed.front.open()]
        var expected: [UInt32] = []
        for (index, device) in devices.enumerated() {
            var stream = FrameEncoder.encode(.hello(Hello(
                userID: "carol", deviceID: "d\(index)", credentials: nil, resume: nil, requestedKeepAliveSeconds: 0)))
            for id in UInt32(1)...40 {
                stream += FrameEncoder.encode(.request(id: id, message("m\(index)-\(id)", to: "sink")))
                if index == 0 { expected.append(id) }
            }
            // Cut at odd places and sent as separate packets, straight after the HELLO.
            var offset = 0
            while offset < stream.count {
                let end = min(stream.count, offset + 7 + offset % 13)
                device.sendRaw(Array(stream[offset..<end]))
                offset = end
            }
        }
        for device in devices {
            _ = try device.expect("WELCOME") { if case .welcome = $0 { true } else { nil } }
            var replies: [UInt32] = []
            while replies.count < expected.count {
                let frame = try device.next()
                guard case .ok(let id, _)? = frame else { Issue.record("expected an OK, got \(String(describing: frame))"); return }
                replies.append(id)
            }
            #expect(replies == expected)
        }
        #expect(bed.home.server.connectionsMovedPerLoop.reduce(0, +) >= 1)
    }

    @Test("the per-address cap counts the address the front reports: one over it gets CLOSE tooManyConnections")
    func perAddressCap() throws {
        let bed = try RelayTestBed { $0.maxConnectionsPerAddress = 1 }
        let (first, _) = try bed.connectRelayed(user: "alice")
        let second = bed.front.open(peer: "203.0.113.7:40001")  // same address, another port
        #expect(try second.expectClose().code == .tooManyConnections)
        let other = bed.front.open(peer: "[2001:db8::7]:40000")
        #expect(try !other.hello(user: "bob").resumed)
        try first.send(.ping)
        #expect(try first.next() == .pong)
    }

    @Test("a drain sends every relayed device CLOSE goingAway, then finish")
    func drain() throws {
        let bed = try RelayTestBed()
        let (device, _) = try bed.connectRelayed(user: "alice")
        bed.home.server.beginShutdown()
        #expect(try device.expectClose().code == .goingAway)
        #expect(try device.awaitEnding() == .finish)
    }

    @Test("what one loop callback writes to several relayed devices of a front leaves in one packet")
    func onePacketPerCallback() throws {
        let bed = try RelayTestBed()
        let (alice, _) = try bed.home.connect(user: "alice")
        let devices = try ["phone", "tablet", "laptop"].map { try bed.connectRelayed(user: "bob", device: $0).0 }
        let before = bed.front.packetsReceived
        #expect(try alice.request(1, message("m1", to: "bob")).isOK)
        for device in devices {
            guard case .message = try device.nextEvent().event else { Issue.record("expected the message"); return }
        }
        #expect(bed.front.packetsReceived - before == 1)
    }

    @Test("the relay's metrics count relayed connections and frames both ways")
    func metrics() throws {
        let bed = try RelayTestBed()
        let (device, _) = try bed.connectRelayed(user: "alice")
        try device.send(.ping)
        #expect(try device.next() == .pong)
        let statistics = bed.home.server.statistics
        #expect(statistics.relayedConnections == 1)
        #expect(statistics.relayFramesReceived >= 3)  // open, HELLO, PING
        #expect(statistics.relayFramesSent >= 2)  // WELCOME, PONG
    }

    @Test("the relay directory keeps one copy of a front's id for all its connections, not one per packet that opened one")
    func frontIDInterned() {
        let directory = RelayDirectory()
        // Each packet decodes its sender's id into a string of its own: made here at run
        // time, longer than a small string, like `HOST/PID/RANDOM`.
        func decodedID() -> String { String(decoding: Array("front-host.example/4242/\(String(repeating: "7", count: 16))".utf8), as: UTF8.self) }
        func storage(_ text: String) -> UnsafeRawPointer? {
            text.utf8.withContiguousStorageIfAvailable { UnsafeRawPointer($0.baseAddress) } ?? nil
        }
        var keys: [RelayKey] = []
        for connection in UInt64(1)...3 {
            let delivery = directory.deliver(.open(peer: "203.0.113.7:4000", tls: false), for: RelayKey(front: decodedID(), connection: connection), loopCount: 2)
            guard case .wake(let key, _) = delivery else {
                Issue.record("open not accepted: \(delivery)")
                return
            }
            keys.append(key)
        }
        #expect(keys.map(\.front) == Array(repeating: decodedID(), count: 3))
        #expect(storage(keys[0].front) != nil)
        #expect(storage(keys[1].front) == storage(keys[0].front))
        #expect(storage(keys[2].front) == storage(keys[0].front))
        // Data for a connection of it also names the one copy.
        #expect(directory.take(keys[0], loop: 0) != nil)  // its loop drained: the next input wakes it again
        guard case .wake(let key, _) = directory.deliver(.data([1]), for: RelayKey(front: decodedID(), connection: 1), loopCount: 2) else {
            Issue.record("data not delivered")
            return
        }
        #expect(storage(key.front) == storage(keys[0].front))
    }
}
