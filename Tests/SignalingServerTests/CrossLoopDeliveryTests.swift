import SignalingProtocol
@testable import SignalingServer
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// Two loops: a device lives on its user's home loop, and an event for another shard's
/// device crosses loops as a step (the owner's inbox), never as a write by the sending
/// loop: every device must get its events once, in order, written by its own loop.
@Suite("Cross-loop delivery")
struct CrossLoopDeliveryTests {
    func message(_ id: String, to recipient: String, bytes: Int = 5) -> Request {
        .messageSend(OutgoingMessage(
            messageID: id, recipient: recipient, contentType: "application/octet-stream",
            body: [UInt8](repeating: 7, count: bytes)))
    }

    /// The message ids of the next `count` events, checking that their sequence numbers
    /// follow `after` without a gap or a repeat.
    func receive(_ count: Int, on client: TestClient, after: UInt64 = 0) throws -> [String] {
        var ids: [String] = []
        for expected in (after + 1)...(after + UInt64(count)) {
            let (seq, event) = try client.nextEvent()
            #expect(seq == expected)
            guard case .message(let message) = event else { throw TestClient.Failure("not a message: \(event)") }
            ids.append(message.messageID)
        }
        return ids
    }

    @Test("a loop going to sleep in epoll takes no lock: an idle loop holds its ownership once per callback (its ticks)")
    func sleepTakesNoLock() throws {
        let server = try TestServer(workers: 1)
        let loop = try #require(server.server.eventLoops.first)
        func observe() -> (holds: UInt64, ticks: Int) {
            (loop.metrics.lockHolds.snapshot(.loopOwnership).count, loop.ticks.load(ordering: .acquiring))
        }
        let before = observe()
        #expect(server.server.awaitTicks(20))
        let after = observe()
        let ticks = UInt64(after.ticks - before.ticks)
        // Each tick is one callback, one hold; a hold taken before each sleep made it two.
        // (Slack: the two counters are read a moment apart.)
        #expect(after.holds - before.holds <= ticks + 2, "\(after.holds - before.holds) holds in \(ticks) ticks")
        #expect(ticks >= 20)
    }

    @Test("events for devices of the other loop's shard cross as steps and are written by their own loop; nothing is lost or reordered")
    func stepsAcrossLoops() throws {
        let server = try TestServer(workers: 2)
        let (alice, _) = try server.connect(user: "alice")
        // At least 16 receivers, and until some are on the other loop than alice.
        var receivers: [TestClient] = []
        while receivers.count < 16 || server.server.openConnectionsPerLoop.contains(0) {
            try #require(receivers.count < 60, "the kernel put \(receivers.count + 1) connections on one loop")
            receivers.append(try server.connect(user: "r\(receivers.count)").0)
        }
        #expect(server.server.openConnectionsPerLoop.reduce(0, +) == receivers.count + 1)
        var requestID: UInt32 = 0
        for round in 0..<3 {
            for index in receivers.indices {
                requestID += 1
                #expect(try alice.request(requestID, message("m\(round)-\(index)", to: "r\(index)")).isOK)
            }
        }
        for (index, receiver) in receivers.enumerated() {
            #expect(try receive(3, on: receiver) == (0..<3).map { "m\($0)-\(index)" })
        }
        let loops = server.server.eventLoops
        #expect(loops.contains { $0.metrics.stepsPosted.value > 0 }, "no event crossed loops")
    }

    @Test("devices that stop reading get every event, in order, once they read again")
    func backpressure() throws {
        let server = try TestServer(workers: 2) { $0.maxQueuedBytes = 8 << 20 }
        let (alice, _) = try server.connect(user: "alice")
        // Each receiver lives on its user's home loop: connect until both loops hold some
        // (with all on alice's loop nothing would cross loops).
        var receivers: [TestClient] = []
        while receivers.count < 6 || server.server.openConnectionsPerLoop.contains(0) {
            try #require(receivers.count < 40, "the kernel put \(receivers.count + 1) connections on one loop")
            let client = try TestClient(port: server.port, receiveWindow: 8192)
            try client.hello(user: "r\(receivers.count)")
            receivers.append(client)
        }
        // Far more than the sockets' buffers hold: writes stop part-way, and the rest waits
        // in the server until the devices read.
        let perReceiver = 100
        var requestID: UInt32 = 0
        for number in 0..<perReceiver {
            for index in receivers.indices {
                requestID += 1
                #expect(try alice.request(requestID, message("m\(number)-r\(index)", to: "r\(index)", bytes: 2000)).isOK)
            }
        }
        for (index, receiver) in receivers.enumerated() {
            #expect(try receive(perReceiver, on: receiver) == (0..<perReceiver).map { "m\($0)-r\(index)" })
            #expect(try receiver.staysSilent(for: .milliseconds(20)))  // and nothing twice
        }
        let statistics = server.server.statistics
        #expect(statistics.slowConsumerCloses == 0)
    }
}

/// The same on embedded loops, where the test knows which loop does what.
@Suite("Cross-loop delivery (embedded loops)")
struct EmbeddedCrossLoopDeliveryTests {
    @Test("a message to another shard's device is a step on that shard's loop, which writes the event; a fan-out to many devices there too; each device gets each event once, in order")
    func stepsThenOwnWrites() throws {
        let server = try EmbeddedServer(workers: 2)
        // Each on its user's home loop (alice's shard is loop 1's, bob's and carol's loop 0's).
        let (alice, _) = try server.connect(user: "alice", loop: 1)
        let (bob, _) = try server.connect(user: "bob", loop: 0)
        #expect(alice.loop == 1 && bob.loop == 0)
        let posted = { server.loops.map { $0.metrics.stepsPosted.value } }
        let ran = { server.loops.map { $0.metrics.stepsRun.value } }
        let (postedBefore, ranBefore) = (posted(), ran())
        #expect(try alice.request(1, LargeMessages.request(1, to: "bob", size: 5)).isOK)
        #expect(posted()[1] > postedBefore[1], "loop 1 did not hand the message to bob's loop")
        #expect(ran()[0] > ranBefore[0], "loop 0 did not run the step")
        #expect(try bob.nextEvent().seq == 1)
        #expect(bob.staysSilent)

        var devices: [EmbeddedClient] = []
        for index in 0..<12 {
            devices.append(try server.connect(user: "carol", device: "d\(index)", loop: 1).0)
        }
        #expect(devices.allSatisfy { $0.loop == 0 })
        for index in 2...3 { #expect(try alice.request(UInt32(index), LargeMessages.request(index, to: "carol", size: 5)).isOK) }
        for device in devices {
            for expected in UInt64(1)...2 {
                let (seq, event) = try device.nextEvent()
                #expect(seq == expected)
                guard case .message(let message) = event else { Issue.record("not a message: \(event)"); return }
                #expect(message.messageID == "m\(expected + 1)")
            }
            #expect(device.staysSilent)
        }
    }
}
