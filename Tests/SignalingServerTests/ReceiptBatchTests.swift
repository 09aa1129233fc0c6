import SignalingProtocol
@testable import SignalingServer
import Testing

/// The receipts of an acknowledgement cross shards as one step per sender and chunk
/// (`ShardStep.receipts`), and the steps one loop hands another in a callback run in
/// shared holds (`Switchboard.drive`): what the senders' devices get must be what one step
/// per receipt gave, every MESSAGE_DELIVERED once, in the order the messages were
/// acknowledged. Two embedded loops (`EmbeddedServer`).
@Suite("Receipts across shards in batches (embedded loops)")
struct ReceiptBatchTests {
    /// The first `count` user ids starting with `prefix` that shard `shard` of 2 holds.
    func users(_ prefix: String, onShard shard: Int, count: Int) -> [String] {
        Array((0...).lazy.map { "\(prefix)\($0)" }.filter { ShardMap.shard(of: $0, count: 2) == shard }.prefix(count))
    }

    /// The ids of the MESSAGE_DELIVERED events `client` reads until it has `count` of them
    /// (skipping the copies of its user's own messages), then checks nothing more comes.
    func receipts(_ count: Int, on client: EmbeddedClient) throws -> [String] {
        var ids: [String] = []
        while ids.count < count {
            if case .messageDelivered(let id, _, _, _) = try client.nextEvent().event { ids.append(id) }
        }
        return ids
    }

    @Test("an ACK of 300 messages from three senders of the other shard (1, 2 and 4 devices): a step per sender and chunk, not per receipt; every sender device gets each receipt once, in order, a batch over a hold's chunk split without reordering")
    func batchedReceiptsKeepOrderExactlyOnce() throws {
        let server = try EmbeddedServer { $0.maxPendingEvents = 100_000 }
        let senders = users("sender", onShard: 0, count: 3)
        let bob = users("bob", onShard: 1, count: 1)[0]
        let deviceCounts = [1, 2, 4]
        var devices: [[EmbeddedClient]] = []
        for (sender, count) in zip(senders, deviceCounts) {
            devices.append(try (0..<count).map { try server.connect(user: sender, device: "d\($0)").0 })
        }
        let (recipient, _) = try server.connect(user: bob)
        #expect(devices.joined().allSatisfy { $0.loop == 0 } && recipient.loop == 1)

        let perSender = 100
        var requestID: UInt32 = 0
        for index in 1...perSender {
            for sending in devices {
                requestID += 1
                #expect(try sending[0].request(requestID, .identifiedMessage("m\(index)", to: bob)).isOK)
            }
        }
        var last: UInt64 = 0
        for _ in 0..<(perSender * senders.count) { last = try recipient.nextEvent().seq }

        let postedBefore = server.loops[1].metrics.stepsPosted.value
        try recipient.ack(last)
        let posted = server.loops[1].metrics.stepsPosted.value - postedBefore
        // 300 events in chunks of 128: 3 holds, each a step per sender (at most 9) plus the
        // acknowledgement's next chunk (2); one step per receipt was 300.
        #expect(posted <= 11, "\(posted) steps for 300 receipts")

        let expected = (1...perSender).map { "m\($0)" }
        for (sender, clients) in zip(senders, devices) {
            for client in clients {
                #expect(try receipts(perSender, on: client) == expected, "\(sender)'s device")
                // The copies of the sender's messages came before the receipts (sent first).
                #expect(client.staysSilent, "\(sender)'s device got more")
            }
        }
    }

    @Test("ACKs one after the other in one read (one callback): their receipts for a sender of the other shard go as one step, in order; another sender's receipt between them starts a new step, the order kept")
    func acknowledgementsOfOneCallbackShareAStep() throws {
        let server = try EmbeddedServer()
        let alice = users("alice", onShard: 0, count: 1)[0]
        let carol = users("carol", onShard: 0, count: 1)[0]
        let bob = users("bob", onShard: 1, count: 1)[0]
        let (fromAlice, _) = try server.connect(user: alice)
        let (fromCarol, _) = try server.connect(user: carol)
        let (recipient, _) = try server.connect(user: bob)
        #expect(fromAlice.loop == 0 && fromCarol.loop == 0 && recipient.loop == 1)
        // alice's m1-m3, then carol's c1, then alice's m4.
        for (index, id) in ["m1", "m2", "m3"].enumerated() {
            #expect(try fromAlice.request(UInt32(index + 1), .identifiedMessage(id, to: bob)).isOK)
        }
        #expect(try fromCarol.request(1, .identifiedMessage("c1", to: bob)).isOK)
        #expect(try fromAlice.request(4, .identifiedMessage("m4", to: bob)).isOK)
        let seqs = try (0..<5).map { _ in try recipient.nextEvent().seq }

        // Five ACKs in one read: one callback of loop 1.
        let postedBefore = server.loops[1].metrics.stepsPosted.value
        let ranBefore = server.loops[0].metrics.stepsRun.value
        try recipient.sendRaw(seqs.flatMap { FrameEncoder.encode(.ack(seq: $0)) })
        // alice's m1-m3 in one step; carol's c1; alice's m4 (not merged over carol's).
        #expect(server.loops[1].metrics.stepsPosted.value - postedBefore == 3)
        #expect(server.loops[0].metrics.stepsRun.value - ranBefore == 3)
        #expect(try receipts(4, on: fromAlice) == ["m1", "m2", "m3", "m4"])
        #expect(try receipts(1, on: fromCarol) == ["c1"])
        #expect(fromAlice.staysSilent && fromCarol.staysSilent)
    }

    @Test("ACKs in one read gather their receipts straight into the step for the other loop, but never across a step handed to that loop between them: a message to the sender between two ACKs reaches it between the two receipts")
    func receiptsNeverOvertakeAStepBetweenThem() throws {
        let server = try EmbeddedServer()
        let alice = users("alice", onShard: 0, count: 1)[0]
        let bob = users("bob", onShard: 1, count: 1)[0]
        let (fromAlice, _) = try server.connect(user: alice)
        let (recipient, _) = try server.connect(user: bob)
        #expect(fromAlice.loop == 0 && recipient.loop == 1)
        #expect(try fromAlice.request(1, .identifiedMessage("m1", to: bob)).isOK)
        #expect(try fromAlice.request(2, .identifiedMessage("m2", to: bob)).isOK)
        let seqs = try (0..<2).map { _ in try recipient.nextEvent().seq }

        // One read of loop 1: ACK m1, bob's message to alice (a step for loop 0), ACK m2.
        let postedBefore = server.loops[1].metrics.stepsPosted.value
        try recipient.sendRaw(
            FrameEncoder.encode(.ack(seq: seqs[0])) + FrameEncoder.encode(.request(id: 1, .identifiedMessage("b1", to: alice)))
                + FrameEncoder.encode(.ack(seq: seqs[1])))
        #expect(try recipient.reply(to: 1).isOK)
        // m1's receipt, bob's message, m2's receipt: three steps, in that order.
        #expect(server.loops[1].metrics.stepsPosted.value - postedBefore == 3)
        var order: [String] = []
        while order.count < 3 {
            switch try fromAlice.nextEvent().event {
            case .messageDelivered(let id, _, _, _): order.append("delivered \(id)")
            case .message(let message): order.append("message \(message.messageID)")
            default: continue
            }
        }
        #expect(order == ["delivered m1", "message b1", "delivered m2"])
        #expect(fromAlice.staysSilent)
    }
}
