import SignalingProtocol
@testable import SignalingServer
import SignalingSupport
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// After its HELLO a connection lives on its user's home loop, the loop that owns the
/// user's routing shard (docs/ARCHITECTURE.md, "Where a connection lives"), whichever
/// loop accepted it.
@Suite("Connections move to their user's home loop (embedded loops)")
struct EmbeddedHomeLoopTests {
    /// Users whose shard (of two) is loop 0's and loop 1's.
    let alice = TwoShards.user("alice", onShard: 0)
    let bob = TwoShards.user("bob", onShard: 1)

    func message(_ id: String, to recipient: String) -> Request {
        .messageSend(OutgoingMessage(messageID: id, recipient: recipient, contentType: "text/plain", body: Array(id.utf8)))
    }

    @Test("a device of loop 1's user accepted on loop 0 lives on loop 1 after its HELLO, loop 0 keeps nothing of it, and the requests it sent in the same bytes as the HELLO are handled after the WELCOME, in order")
    func movesWithPipelinedRequests() throws {
        let server = try EmbeddedServer(workers: 2)
        let (receiver, _) = try server.connect(user: alice, loop: 0)
        let client = try server.client(loop: 0)
        #expect(client.loop == 0)
        try client.sendRaw(
            FrameEncoder.encode(.hello(Hello(userID: bob, deviceID: "d1")))
                + FrameEncoder.encode(.request(id: 1, message("m1", to: alice)))
                + FrameEncoder.encode(.ping)
                + FrameEncoder.encode(.request(id: 2, message("m2", to: alice))))
        guard case .welcome? = try client.read() else { Issue.record("no WELCOME first"); return }
        // Replies carry no order (PROTOCOL.md §6): a message to another shard's user is
        // answered once its step has run on that shard's loop, the PING at once.
        var replies: [String] = []
        for _ in 0..<3 {
            switch try client.read() {
            case .ok(let id, _)?: replies.append("ok\(id)")
            case .pong?: replies.append("pong")
            case let other: Issue.record("unexpected \(String(describing: other))"); return
            }
        }
        #expect(replies.sorted() == ["ok1", "ok2", "pong"])
        // The requests were handled in the order they were sent.
        #expect(try receiver.nextMessageIDs(2) == ["m1", "m2"])

        #expect(client.loop == 1)
        #expect(server.loops[0].metrics.connectionsMoved.value == 1)
        #expect(server.loops[1].metrics.connectionsMoved.value == 0)
        // Loop 0 holds nothing of it: only alice's connection, no slot, no count, no address.
        #expect(server.loops[0].table.liveCount == 1)
        #expect(server.loops[0].openConnections.load(ordering: .relaxed) == 1)
        #expect(server.loops[0].departing.isEmpty && server.loops[0].proxiedPeers.isEmpty)
        #expect(server.loops[1].table.liveCount == 1)
        #expect(server.loops[1].openConnections.load(ordering: .relaxed) == 1)
        #expect(server.statistics.openConnections == 2 && server.statistics.establishedConnections == 2)
    }

    @Test("devices of both shards, each accepted on the other loop, end on their home loops; messages, receipts and a call between them work")
    func bothShards() throws {
        let server = try EmbeddedServer(workers: 2)
        let (alicePhone, _) = try server.connect(user: alice, loop: 1)
        let (bobPhone, _) = try server.connect(user: bob, loop: 0)
        #expect(alicePhone.loop == 0 && bobPhone.loop == 1)
        #expect(server.loops.map { $0.metrics.connectionsMoved.value } == [1, 1])

        #expect(try alicePhone.request(1, message("to-bob", to: bob)).isOK)
        #expect(try bobPhone.nextMessageIDs(1) == ["to-bob"])
        guard case .messageDelivered = try alicePhone.nextEvent().event else { Issue.record("no receipt for alice"); return }
        #expect(try bobPhone.request(1, message("to-alice", to: alice)).isOK)
        #expect(try alicePhone.nextMessageIDs(1) == ["to-alice"])
        guard case .messageDelivered = try bobPhone.nextEvent().event else { Issue.record("no receipt for bob"); return }

        #expect(try alicePhone.request(2, .callInvite(callID: "c1", callee: bob, offer: [1])).isOK)
        guard case .callIncoming("c1", _, _, _, _) = try bobPhone.nextEvent().event else { Issue.record("bob did not ring"); return }
        #expect(try bobPhone.request(2, .callAccept(callID: "c1", answer: [2])).isOK)
        #expect(try alicePhone.nextEvent().event == .callAccepted(callID: "c1", device: "d1", answer: [2]))
    }

    @Test("a device that connects again takes over its older connection on their home loop, with no cross-loop close")
    func takeoverOnOneLoop() throws {
        let server = try EmbeddedServer(workers: 2)
        let (old, _) = try server.connect(user: bob, loop: 1)
        let (new, _) = try server.connect(user: bob, loop: 0)
        #expect(old.loop == 1 && new.loop == 1)
        #expect(try old.expectClose().code == .replaced)
        #expect(new.isOpenAndQuiet)
        #expect(server.statistics.takeovers == 1)
    }

    @Test("a HELLO refused before the shard (keep-alive too short) is closed with CLOSE on the loop that accepted it, which never hands it over")
    func refusedWhereAccepted() throws {
        let server = try EmbeddedServer(workers: 2)
        let client = try server.client(loop: 0)
        #expect(throws: TestClient.Failure.self) { try client.hello(user: bob, keepAlive: 5) }
        #expect(server.loops.map { $0.metrics.connectionsMoved.value } == [0, 0])
        #expect(server.loops[0].metrics.handshakesRefused(.keepAliveTooShort) == 1)
        #expect(client.socket.endOfStream && client.loop == 0)
    }

    @Test("a connection handed over to a loop that is draining gets CLOSE goingAway from it")
    func handedOverToDrainingLoop() throws {
        let server = try EmbeddedServer(workers: 2)
        server.loops[1].post(.drain)
        server.runUntilQuiet()
        let client = try server.client(loop: 0)
        try client.send(.hello(Hello(userID: bob, deviceID: "d1")))
        #expect(try client.expectClose().code == .goingAway)
        #expect(client.loop == 1)
        #expect(server.statistics.establishedConnections == 0)
    }

    @Test("a connection whose home loop has stopped is closed with CLOSE goingAway by the loop that verified its HELLO")
    func homeLoopStopped() throws {
        let server = try EmbeddedServer(workers: 2)
        server.loops[1].closeInbox()  // what a loop does when its `run` ends (nothing was posted to it)
        let client = try server.client(loop: 0)
        try client.send(.hello(Hello(userID: bob, deviceID: "d1")))
        #expect(try client.expectClose().code == .goingAway)
        #expect(client.loop == 0)
        #expect(server.loops[0].metrics.connectionsMoved.value == 1)
        #expect(server.statistics.establishedConnections == 0)
    }

    @Test("with one loop nothing moves")
    func oneLoop() throws {
        let server = try EmbeddedServer(workers: 1)
        let (phone, _) = try server.connect(user: bob)
        try phone.send(.ping)
        #expect(try phone.read() == .pong)
        #expect(server.loops[0].metrics.connectionsMoved.value == 0)
        #expect(Switchboard.ownerLoop(ofShard: 0, shardCount: 1, loopCount: 1) == 0)
        #expect(Switchboard.ownerLoop(ofShard: 1, shardCount: 2, loopCount: 2) == 1)
        #expect(Switchboard.ownerLoop(ofShard: 0, shardCount: 1, loopCount: 2) == nil)
    }
}

/// The same over real sockets, where the kernel picks the accepting loop (SO_REUSEPORT):
/// the socket, TLS state and address accounting move between event bases.
@Suite("Connections move to their user's home loop (real sockets, two loops)")
struct HomeLoopEndToEndTests {
    /// `count` users, alternating between the two shards.
    func users(_ count: Int) -> [String] {
        (0..<count).map { TwoShards.user("u\($0)x", onShard: $0 % 2) }
    }

    @Test("many devices of users of both shards each end on their home loop, and talk across shards")
    func manyDevices() throws {
        let server = try TestServer(workers: 2)
        let users = users(24)
        var clients: [TestClient] = []
        for user in users { clients.append(try server.connect(user: user).0) }
        #expect(server.server.openConnectionsPerLoop == [12, 12])
        // 24 connections spread at random: the chance that none moved is 2^-24.
        #expect(server.server.connectionsMovedPerLoop.reduce(0, +) > 0)
        for (index, client) in clients.enumerated() {
            let next = users[(index + 1) % users.count]
            #expect(try client.request(1, .messageSend(OutgoingMessage(
                messageID: "m\(index)", recipient: next, contentType: "text/plain", body: [1]))).isOK)
        }
        for (index, client) in clients.enumerated() {
            // Not acknowledged: a receipt would come between a device and its message.
            #expect(try client.nextMessageIDs(1, acknowledging: false) == ["m\((index + users.count - 1) % users.count)"])
        }
        #expect(server.server.statistics.openConnections == 24)
    }

    @Test("a TLS device accepted on the other loop moves with its TLS session and keeps working, its pipelined request answered")
    func tlsMoves() throws {
        let certificates = try TestCertificates()
        let server = try TestServer { TestServer.tls(certificates, &$0) }
        let alice = TwoShards.user("alice", onShard: 0)
        let (receiver, _) = try server.connect(user: alice)
        var devices: [TestClient] = []
        var number = 0
        // Devices of users of loop 1 until the kernel put one on loop 0.
        while server.server.connectionsMovedPerLoop[0] == 0 {
            try #require(number < 40, "the kernel put every connection on loop 1")
            number += 1
            let device = try server.tlsClient(certificates)
            try device.sendRaw(
                FrameEncoder.encode(.hello(Hello(userID: TwoShards.user("t\(number)x", onShard: 1), deviceID: "d1")))
                    + FrameEncoder.encode(.request(id: 1, .messageSend(OutgoingMessage(
                        messageID: "m\(number)", recipient: alice, contentType: "text/plain", body: [1])))))
            guard case .welcome? = try device.next() else { Issue.record("no WELCOME"); return }
            guard case .ok(1, _)? = try device.next() else { Issue.record("the pipelined request was not answered"); return }
            devices.append(device)
        }
        #expect(try receiver.nextMessageIDs(number) == (1...number).map { "m\($0)" })
        #expect(server.server.openConnectionsPerLoop == [1, number])
        let moved = devices.last!
        try moved.send(.ping)
        // Its own message's receipt may come first (alice acknowledged it): kept for later.
        try moved.expect("PONG") { $0 == .pong ? () : nil }
        #expect(try receiver.request(1, .messageSend(OutgoingMessage(
            messageID: "back", recipient: TwoShards.user("t\(number)x", onShard: 1), contentType: "text/plain", body: [2]))).isOK)
        // Its own message's receipt first (alice acknowledged it), then alice's message.
        guard case .messageDelivered = try moved.nextEvent().event else { Issue.record("no receipt"); return }
        #expect(try moved.nextMessageIDs(1) == ["back"])
        #expect(server.server.statistics.openTLSConnections == number)
    }

    @Test("HELLOs refused by their token are closed with CLOSE on the loop that accepted them; none moves")
    func refusedWhereAccepted() throws {
        let server = try TestServer { $0.authKeys = [DeviceTokenTests.current] }
        // Users of both shards: about half of the connections land on the other loop
        // than their user's, where a verified HELLO would move.
        for number in 0..<8 {
            let client = try server.client()
            try client.send(.hello(Hello(
                userID: TwoShards.user("bad\(number)x", onShard: number % 2), deviceID: "d1", credentials: Array("not a token".utf8))))
            let close = try client.expectClose()
            #expect(close.code == .unauthorized, "\(close)")
        }
        #expect(server.server.connectionsMovedPerLoop == [0, 0])
        #expect(server.server.eventLoops.reduce(0) { $0 + $1.metrics.handshakesRefused(.unauthorized) } == 8)
    }

    @Test("a drain while devices are handshaking and moving: every device gets CLOSE goingAway")
    func drainDuringMoves() throws {
        let server = try TestServer(workers: 2)
        let users = users(32)
        var clients: [TestClient] = []
        for _ in users { clients.append(try server.client()) }
        // Accepted, all of them: a connection still in the listen backlog would be reset
        // when the drain closes the listener, and that is not what this test is about.
        try server.waitFor("the connections to be accepted") { $0.openConnections == users.count }
        for (client, user) in zip(clients, users) { try client.send(.hello(Hello(userID: user, deviceID: "d1"))) }
        server.server.beginShutdown()
        for client in clients {
            // WELCOME first if the HELLO won the race with the drain; CLOSE in every case.
            let close = try client.expect(timeout: .seconds(10), "CLOSE") { frame -> Close? in
                if case .close(let close) = frame { return close }
                return nil
            }
            #expect(close.code == .goingAway)
        }
    }
}
