import SignalingProtocol
@testable import SignalingServer
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// Two loops: events routed on one loop to a connection of the other are written either
/// by the routing loop itself (the other one asleep) or by their own loop (handed over).
/// Whichever path each write takes, every device must get its events once, in order.
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

    @Test("a loop writes events for idle connections of the other loop itself; nothing is lost or reordered")
    func directWrites() throws {
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
        #expect(server.server.statistics.crossLoopWrites > 0)
    }

    @Test("devices that stop reading get every event, in order, once they read again")
    func backpressure() throws {
        let server = try TestServer(workers: 2) { $0.maxQueuedBytes = 8 << 20 }
        let (alice, _) = try server.connect(user: "alice")
        // The kernel spreads connections over the loops at random: connect until both
        // hold some (with all on alice's loop nothing would cross, and the test would
        // prove nothing about cross-loop writes).
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
        #expect(statistics.crossLoopWrites > 0)
    }
}

/// The same two paths on embedded loops, where each connection lives on its user's home
/// loop and the test knows which path each write takes.
@Suite("Cross-loop delivery (embedded loops)")
struct EmbeddedCrossLoopDeliveryTests {
    @Test("an event for a sleeping loop's connection is written by the routing loop itself; a fan-out to more of its connections is handed over; each device gets each event once, in order")
    func directAndHandedOver() throws {
        let server = try EmbeddedServer(workers: 2)
        // Each on its user's home loop (alice's shard is loop 1's, bob's and carol's loop 0's).
        let (alice, _) = try server.connect(user: "alice", loop: 1)
        let (bob, _) = try server.connect(user: "bob", loop: 0)
        #expect(alice.loop == 1 && bob.loop == 0)
        #expect(try alice.request(1, LargeMessages.request(1, to: "bob", size: 5)).isOK)
        #expect(server.statistics.crossLoopWrites == 1, "loop 0 did not write bob's event itself")
        #expect(try bob.nextEvent().seq == 1)
        #expect(bob.staysSilent)

        var devices: [EmbeddedClient] = []
        for index in 0...EventLoop.peerWriteLimit {
            devices.append(try server.connect(user: "carol", device: "d\(index)", loop: 0).0)
        }
        for index in 2...3 { #expect(try alice.request(UInt32(index), LargeMessages.request(index, to: "carol", size: 5)).isOK) }
        #expect(server.statistics.crossLoopWrites == 1, "the fan-out was not handed over to loop 1")
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
