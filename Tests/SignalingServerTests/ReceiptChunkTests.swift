import SignalingProtocol
@testable import SignalingServer
import SignalingSupport
import Testing

/// A receipt reaches its sender's devices a chunk per hold (`DeviceBroadcast`,
/// `ShardStep.continueBroadcast`): alice has 300 devices; bob, on the other shard (or
/// carol, on alice's), acknowledges her messages.
@Suite("A receipt reaches a sender's devices a chunk per hold (routing core, pure)")
struct ReceiptChunkTests {
    static let chunk = SwitchboardState.fanOutChunk
    let alice = TwoShards.user("alice", onShard: 0)
    let bob = TwoShards.user("bob", onShard: 1)
    let carol = TwoShards.user("carol", onShard: 0)

    /// The message ids of the MESSAGE_DELIVERED events `device` has, in queue order.
    func receipts(_ device: DeviceRecord) -> [String] {
        TwoShards.events(device).compactMap { event in
            guard case .messageDelivered(let id, _, _, _) = event else { return nil }
            return id
        }
    }

    /// alice's 300 devices (the first sends) and the recipient's one.
    func devices(_ shards: inout TwoShards, recipient: String) throws -> (alice: [DeviceRecord], recipient: DeviceRecord) {
        let senders = try (0..<300).map { try shards.attach(alice, "d\($0)", slot: UInt32($0 + 10), at: 1) }
        return (senders, try shards.attach(recipient, slot: 1, at: 1))
    }

    /// alice's first device sends `ids` to `recipient`, each decided at once.
    func send(_ ids: [String], to recipient: String, from device: DeviceRecord, _ shards: inout TwoShards) {
        var effects: [SwitchboardEffect] = []
        for id in ids {
            let reply = shards.request(alice, at: 2) { state in
                switch state.send(TwoShards.message(id, to: recipient), from: device, now: TwoShards.at(2), into: &effects) {
                case .success(let acceptance):
                    StepOutcome(reply: acceptance.handOff == nil ? .success(acceptance.serverTime) : nil, next: acceptance.handOff.map { [$0] } ?? [])
                case .failure(let refusal): .answered(.failure(refusal))
                }
            }
            #expect(TwoShards.isOK(reply), "\(id)")
        }
    }

    /// `device` acknowledges everything it has: the events the ACK's hold queued on alice's
    /// shard, and the steps it hands on.
    func acknowledgeAll(_ device: DeviceRecord, _ shards: inout TwoShards) -> (queued: Int, next: [ShardStep]) {
        var effects: [SwitchboardEffect] = []
        let shard = ShardMap.shard(of: device.userID, count: 2)
        let before = shards.states[0].counters.eventsQueued
        let (violation, next) = shards.states[shard].ack(device, connection: device.connection!, through: device.lastSeq, into: &effects)
        #expect(violation == nil)
        return (shards.states[0].counters.eventsQueued - before, next)
    }

    @Test("a receipt from another shard reaches 300 sender devices in ceil(300/128) holds of at most 128 copies, each device once")
    func acrossShardsInChunks() throws {
        var shards = TwoShards()
        let (senders, recipient) = try devices(&shards, recipient: bob)
        send(["m1"], to: bob, from: senders[0], &shards)
        let acked = acknowledgeAll(recipient, &shards)
        #expect(acked.queued == 0, "the receipt is alice's shard's step")
        let perHold = try shards.eventsPerHold(acked.next, on: 0)
        #expect(perHold == [128, 128, 44])
        for device in senders { #expect(receipts(device) == ["m1"], "\(device.deviceID)") }
    }

    @Test("receipts of one ACK reach every sender device once each, in the order acknowledged, at most 128 copies a hold")
    func receiptsInOrder() throws {
        var shards = TwoShards()
        let (senders, recipient) = try devices(&shards, recipient: bob)
        let ids = ["m1", "m2", "m3"]
        send(ids, to: bob, from: senders[0], &shards)
        let acked = acknowledgeAll(recipient, &shards)
        let perHold = try shards.eventsPerHold(acked.next, on: 0)
        #expect(perHold.allSatisfy { $0 <= Self.chunk })
        #expect(perHold.reduce(0, +) == 3 * 300)
        for device in senders { #expect(receipts(device) == ids, "\(device.deviceID)") }
    }

    @Test("a receipt from the same shard: the ACK's hold queues at most 128 copies, the rest in holds of their own")
    func sameShardInChunks() throws {
        var shards = TwoShards()
        let (senders, recipient) = try devices(&shards, recipient: carol)
        send(["m1", "m2"], to: carol, from: senders[0], &shards)
        let acked = acknowledgeAll(recipient, &shards)
        let perHold = try [acked.queued] + shards.eventsPerHold(acked.next, on: 0)
        #expect(perHold.allSatisfy { $0 <= Self.chunk + 1 }, "a chunk of copies, and an event taken out")
        #expect(perHold.reduce(0, +) == 2 * 300)
        for device in senders { #expect(receipts(device) == ["m1", "m2"], "\(device.deviceID)") }
    }

    @Test("a sender device that reconnects while a receipt goes out gets it once")
    func reconnectMidReceipt() throws {
        var effects: [SwitchboardEffect] = []
        var shards = TwoShards()
        let (senders, recipient) = try devices(&shards, recipient: bob)
        send(["m1"], to: bob, from: senders[0], &shards)
        var pending = acknowledgeAll(recipient, &shards).next
        // The receipt step: the first chunk (the newest 128 devices).
        let first = pending.removeFirst()
        pending += shards.states[0].handle(first, now: TwoShards.at(3), into: &effects).next
        let waiting = try #require(senders.first { receipts($0).isEmpty })
        let reached = try #require(senders.last { !receipts($0).isEmpty })
        for (number, device) in [waiting, reached].enumerated() {
            shards.states[0].detach(device, connection: device.connection!, now: TwoShards.at(3))
            _ = try shards.states[0].attach(
                userID: alice, deviceID: device.deviceID, resume: ResumePoint(sessionID: device.sessionID, lastReceivedSeq: 0),
                connection: TwoShards.connection(UInt32(9_000 + number)), now: TwoShards.at(3), into: &effects
            ).get()
        }
        _ = try shards.eventsPerHold(pending, on: 0)
        for device in senders { #expect(receipts(device) == ["m1"], "\(device.deviceID)") }
    }

    @Test("with a store, every hold of a receipt's copies is a unit of the acknowledgement's commit group")
    func journaledInTheAcknowledgementsGroup() throws {
        var effects: [SwitchboardEffect] = []
        var shards = TwoShards(journaling: true)
        let (senders, recipient) = try devices(&shards, recipient: carol)
        send(["m1"], to: carol, from: senders[0], &shards)
        _ = shards.states[0].takeCommitUnit()
        let (_, next) = shards.states[0].ack(recipient, connection: recipient.connection!, through: recipient.lastSeq, into: &effects)
        // As the loop does: the ACK's steps are run in a group started with its unit.
        let started = shards.states[0].group(for: next)
        let group = try #require(started)
        let taken = shards.states[0].takeCommitUnit()
        let first = try #require(taken)
        #expect(first.group === group && !first.closesGroup)
        var pending = next, units = 0
        while !pending.isEmpty {
            let step = pending.removeFirst()
            pending += shards.states[0].handle(step, now: TwoShards.at(3), into: &effects).next
            let taken = shards.states[0].takeCommitUnit()
            let unit = try #require(taken)
            #expect(unit.group === group && !unit.closesGroup)
            units += 1
        }
        #expect(units == 2, "the receipt's second and third chunks")
    }

    @Test("receipts waiting behind a sender's broadcast in progress count against --memory-budget until they have gone out: past it a new message is refused with capacityExceeded")
    func waitingReceiptsCountAgainstTheBudget() throws {
        var effects: [SwitchboardEffect] = []
        var shards = TwoShards()
        let (senders, recipient) = try devices(&shards, recipient: bob)
        let ids = (1...5).map { "m\($0)" }
        send(ids, to: bob, from: senders[0], &shards)
        let acked = acknowledgeAll(recipient, &shards)
        let ledger = shards.states[0].ledger
        let before = ledger.bytes
        // The receipts' step (a hold each, the rest of the batch first in the next): the
        // first receipt's first chunk goes out, the others wait behind it.
        var pending = acked.next
        while let step = pending.first, case .receipts = step {
            pending.removeFirst()
            pending = shards.states[0].handle(step, now: TwoShards.at(3), into: &effects).next + pending
        }
        let receiptCost = DeviceBroadcast.footprint + QueuedEvent.footprint(of: EncodedEvent(
            .messageDelivered(messageID: "m1", recipient: bob, recipientDevice: "d1", serverTime: 1)))
        #expect(ledger.bytes - before >= ids.count * DeviceBroadcast.footprint)
        #expect(ledger.bytes - before <= ids.count * (receiptCost + 16))
        // With the budget just below what the server holds now, a message is refused.
        shards.states[0].configuration.memoryBudget = ledger.bytes
        let refused = shards.states[0].send(TwoShards.message("late", to: bob), from: senders[0], now: TwoShards.at(3), into: &effects)
        #expect(TwoShards.code(refused.map { $0.serverTime }) == .capacityExceeded)
        // Once every receipt has gone out, their memory is free again.
        _ = try shards.eventsPerHold(pending, on: 0)
        #expect(ledger.bytes == before)
        for device in senders { #expect(receipts(device) == ids, "\(device.deviceID)") }
        #expect(TwoShards.isOK(shards.run([try #require(try shards.states[0].send(
            TwoShards.message("later", to: bob), from: senders[0], now: TwoShards.at(4), into: &effects).get().handOff)], at: 4)))
    }
}
