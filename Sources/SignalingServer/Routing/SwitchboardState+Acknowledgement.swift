import SignalingProtocol
import SignalingSupport

/// An acknowledgement (an ACK, or a resume point) that covers more of a device's events
/// than one hold of its shard takes out (`SwitchboardState.ackChunk`): the events go in
/// holds of their own, a chunk each, the oldest first, driven by a
/// `ShardStep.continueAcknowledgement` (docs/ARCHITECTURE.md, "Routing shards").
///
/// What the device sees is as if the whole acknowledgement were taken in one hold: from the
/// hold that receives it, everything through `through` counts as acknowledged
/// (`SwitchboardState.acknowledgedSeq(of:)`: WELCOME's `ackedSeq`, where a pump starts, which
/// later ACK is a duplicate), though its events leave the queue a chunk a hold. Each chunk
/// makes the receipts of the messages it takes out (delivered in that hold to a sender of
/// the shard, steps for the others), so every event makes its receipt exactly once,
/// whichever hold takes it.
///
/// A device has at most one in progress: a higher ACK or resume point meanwhile raises its
/// `through` (after taking a chunk in its own hold), a lower or equal one changes nothing.
/// A disconnect or a takeover meanwhile changes nothing either (the device did acknowledge);
/// a device forgotten meanwhile ends it (`removeDevice`).
///
/// With a store, the hold that receives the acknowledgement journals all of it
/// (`StoreChange.acknowledge` through `through`), and every later hold of the chain hands
/// its changes (the receipts' events) in as units of the same `CommitGroup`
/// (`SwitchboardState.group(for:)`, closed by `Switchboard.run` after the last step): the
/// writer commits the acknowledgement and every receipt it made in one transaction. So at
/// every commit the store holds all of it or none of it: a crash before that commit sends
/// the events again, as it would have for an acknowledgement taken in one hold (the client
/// drops them by number), and one after it sends none of them and loses no receipt.
///
/// Guarded by the lock of the device's shard, like the record it points to.
final class Acknowledgement: @unchecked Sendable {
    /// Names the acknowledgement in its shard (`SwitchboardState.acknowledgements`) and in
    /// its steps.
    let id: UInt64
    let device: DeviceRecord
    /// Everything ≤ this is acknowledged (the highest ACK or resume point since it started).
    var through: UInt64

    init(id: UInt64, device: DeviceRecord, through: UInt64) {
        self.id = id
        self.device = device
        self.through = through
    }
}

/// The acknowledgements in progress in one shard, by id (for their steps) and by device
/// (for the device's next ACK, its pump, its removal). Empty on the usual path (an ACK
/// of a batch or two): one emptiness check then.
struct Acknowledgements {
    private(set) var byID: [UInt64: Acknowledgement] = [:]
    private var byDevice: [ObjectIdentifier: Acknowledgement] = [:]
    private var lastID: UInt64 = 0

    var isEmpty: Bool { byID.isEmpty }

    subscript(id: UInt64) -> Acknowledgement? { byID[id] }

    /// `device`'s acknowledgement in progress. With one in progress (typical under a
    /// fan-out: its sender taking in a stream of receipts, while every other device's ACK
    /// asks) it is compared, not looked up: hashing the key (SipHash) for every ACK was
    /// about 60 instructions per event of a fan-out across two shards (callgrind, issue 16).
    func of(_ device: DeviceRecord) -> Acknowledgement? {
        switch byDevice.count {
        case 0: return nil
        case 1:
            let only = byDevice.first!.value
            return only.device === device ? only : nil
        default: return byDevice[ObjectIdentifier(device)]
        }
    }

    /// Starts one for `device`, which has none.
    mutating func start(_ device: DeviceRecord, through: UInt64) -> Acknowledgement {
        lastID += 1
        let started = Acknowledgement(id: lastID, device: device, through: through)
        byID[started.id] = started
        byDevice[ObjectIdentifier(device)] = started
        return started
    }

    mutating func remove(_ acknowledgement: Acknowledgement) {
        byID[acknowledgement.id] = nil
        if byDevice[ObjectIdentifier(acknowledgement.device)] === acknowledgement {
            byDevice[ObjectIdentifier(acknowledgement.device)] = nil
        }
    }
}

/// Where a hold of an acknowledgement hands what it makes for other holds
/// (`SwitchboardState.ack(_:connection:through:handingOn:)`), in the order it makes them:
/// the steps returned to its caller (`[ShardStep]`, which `Switchboard.run` routes), or,
/// for a loop's ACK, the receipts for other shards' senders straight into the loop's
/// outgoing batch for the sender (`EventLoop.AcknowledgementSteps`): no array, step or
/// `run` per ACK for what joins a batch (callgrind, issue 16: docs/LOAD-TESTING.md,
/// "Routing on more cores").
protocol StepsHandedOn {
    /// A step for another hold (the next chunk, a receipt's copies in holds of their own).
    mutating func handOn(_ step: ShardStep)
    /// A receipt for `sender`, a user of shard `shard` (not the hold's own): one step per
    /// sender for the receipts of one hold, in their order. `board` is the hold's shard
    /// (with a store, the receipts' steps join its commit unit's group:
    /// `SwitchboardState.operationGroup`).
    mutating func handOn(
        _ receipt: consuming ReceiptBatch.Receipt, for sender: String, shard: Int, in board: inout SwitchboardState)
}

extension Array: StepsHandedOn where Element == ShardStep {
    mutating func handOn(_ step: ShardStep) { append(step) }

    /// Adds `receipt` to the step that batches `sender`'s receipts, or starts one: one
    /// step per sender, each in the order of the events. A lookup from the newest step
    /// back (a chunk's receipts usually go to one or two senders; at most a chunk of
    /// compares of short ids per receipt otherwise).
    mutating func handOn(
        _ receipt: consuming ReceiptBatch.Receipt, for sender: String, shard: Int, in board: inout SwitchboardState
    ) {
        guard let index = lastIndex(where: { $0.user == sender }), case .receipts(var batch) = self[index] else {
            return append(.receipts(ReceiptBatch(sender: sender, receipts: [receipt])))
        }
        // A placeholder while `batch` is out, so that its array has one reference and the
        // append does not copy it.
        self[index] = .continueAcknowledgement(user: sender, id: 0)
        batch.receipts.append(receipt)
        self[index] = .receipts(batch)
    }
}

extension SwitchboardState {
    /// How much one hold of a shard does for an acknowledgement: events taken out of the
    /// device's queue, plus the MESSAGE_DELIVERED copies their receipts queue to senders of
    /// the same shard (`takeAcknowledgedChunk`). Taking an event out costs about 0.1 µs,
    /// plus its receipt: its place in the step of a sender on another shard (one per sender), or a copy to each device of
    /// a sender on the same shard (about 0.2 µs each). An ACK of 4,000 events with receipts held the
    /// shard for 262 µs-1 ms in one hold (docs/LOAD-TESTING.md, "Fan-out holds"); 128 keep a
    /// hold near the fan-out's chunk, while the extra hold and step per chunk (a lock round
    /// and a dictionary lookup) stay under 1 % of the chunk's work.
    static let ackChunk = 128

    /// A cumulative ACK from the device's live connection: a violation, or what it hands on
    /// (receipts for senders on other shards, the rest of a long acknowledgement).
    mutating func ack(
        _ device: DeviceRecord, connection: ConnectionRef, through seq: UInt64, into effects: inout [SwitchboardEffect]
    ) -> (violation: ProtocolViolation?, next: [ShardStep]) {
        var next: [ShardStep] = []
        let violation = ack(device, connection: connection, through: seq, handingOn: &next, into: &effects)
        return (violation, next)
    }

    /// `ack(_:connection:through:)` handing its steps to `next` as it makes them: a loop's
    /// ACK without a store gives its receipts for other shards' senders straight to the
    /// callback's outgoing steps (`EventLoop.acknowledge`).
    mutating func ack<Next: StepsHandedOn>(
        _ device: DeviceRecord, connection: ConnectionRef, through seq: UInt64, handingOn next: inout Next,
        into effects: inout [SwitchboardEffect]
    ) -> ProtocolViolation? {
        assertOwns(device)
        guard device.connection == connection else { return nil }  // a late ACK from an evicted connection
        guard seq <= device.lastSeq else {
            return ProtocolViolation(.invalidSequence, "ACK \(seq) is beyond the last event sent (\(device.lastSeq))")
        }
        acknowledge(device, through: seq, handingOn: &next, into: &effects)
        return nil
    }

    /// Everything ≤ this is acknowledged by `device`: the events before its oldest queued
    /// one, or further, while an acknowledgement is still taking its events out in chunks.
    func acknowledgedSeq(of device: DeviceRecord) -> UInt64 {
        guard let inProgress = acknowledgements.of(device) else { return device.ackedSeq }
        return max(device.ackedSeq, inProgress.through)
    }

    /// `device` acknowledged everything through `seq`: takes out the first chunk of its
    /// events and, when more are left, hands on the step that takes the rest (or, with one
    /// in progress already, lets that one go on to `seq`). Returns the steps to run next:
    /// the chunk's receipts for senders on other shards, then the continuation.
    mutating func acknowledge(_ device: DeviceRecord, through seq: UInt64, into effects: inout [SwitchboardEffect]) -> [ShardStep] {
        var next: [ShardStep] = []
        acknowledge(device, through: seq, handingOn: &next, into: &effects)
        return next
    }

    /// `acknowledge(_:through:)` handing its steps to `next`, in the same order.
    mutating func acknowledge<Next: StepsHandedOn>(
        _ device: DeviceRecord, through seq: UInt64, handingOn next: inout Next, into effects: inout [SwitchboardEffect]
    ) {
        let inProgress = acknowledgements.of(device)
        guard seq > max(device.ackedSeq, inProgress?.through ?? 0) else { return }
        journal(.acknowledge(user: device.userID, device: device.deviceID, through: seq))
        takeAcknowledgedChunk(of: device, through: seq, handingOn: &next, into: &effects)
        if let inProgress {
            inProgress.through = seq  // its next hold goes on to here
        } else if device.ackedSeq < seq {
            let started = acknowledgements.start(device, through: seq)
            next.handOn(.continueAcknowledgement(user: device.userID, id: started.id))
        }
    }

    /// The next chunk of acknowledgement `id`, and the step for the one after, if any.
    /// Nothing when the device was forgotten meanwhile.
    mutating func continueAcknowledgement(_ user: String, id: UInt64, into effects: inout [SwitchboardEffect]) -> StepOutcome {
        guard let acknowledgement = acknowledgements[id] else { return StepOutcome(reply: nil) }
        let device = acknowledgement.device
        var next: [ShardStep] = []
        takeAcknowledgedChunk(of: device, through: acknowledgement.through, handingOn: &next, into: &effects)
        if device.ackedSeq < acknowledgement.through {
            next.append(.continueAcknowledgement(user: user, id: id))
        } else {
            acknowledgements.remove(acknowledgement)
        }
        return StepOutcome(reply: nil, next: next)
    }

    /// `device` is being forgotten: its acknowledgement in progress, if any, ends (its queue
    /// is counted out with it).
    mutating func forgetAcknowledgement(of device: DeviceRecord) {
        if let inProgress = acknowledgements.of(device) { acknowledgements.remove(inProgress) }
    }

    /// Drops the oldest of `device`'s events through `seq` and makes their receipts:
    /// delivered here to a sender this shard holds (as `handOn` would, counting the copies),
    /// returned as one step per sender for the others (`ShardStep.receipts`). Stops after `ackChunk` units of work, an event
    /// and each MESSAGE_DELIVERED copy a receipt queues here counting one: a sender of the
    /// same shard with 1,000 devices made a chunk of 128 receipts 128,000 copies in one
    /// hold. At least one event goes per hold, and a receipt queues at most a chunk of
    /// copies in it (the rest by its own step, `deliverReceipt`): a hold is at most about
    /// two chunks. Hands `next` the receipts for other shards' senders and the steps of
    /// receipts whose copies take several holds, in the order of the events.
    private mutating func takeAcknowledgedChunk<Next: StepsHandedOn>(
        of device: DeviceRecord, through seq: UInt64, handingOn next: inout Next, into effects: inout [SwitchboardEffect]
    ) {
        let shareQueue = ShareQueue.device(ObjectIdentifier(device))
        let sharesTracked = sharesTracked(shareQueue, count: device.queue.count)
        var removedMessages: [QueuedEvent] = []
        var work = 0
        while work < configuration.ackChunk && device.ackedSeq < seq {
            var receipt: DeliveryReceipt?
            device.removeThrough(seq, limit: 1) { _, event in
                if sharesTracked && event.receipt != nil { removedMessages.append(event) }
                counters.pendingEvents -= 1
                // A sender's own devices get its messages too (multi-device sync): only the
                // recipient's acknowledgements are deliveries.
                // A copy still awaiting its decision was never written: a client acknowledging
                // it acknowledged blindly, and its sender must not hear of a delivery before OK.
                if let made = event.receipt, !event.isCancelled, !event.awaitsDecision, made.recipient == device.userID {
                    receipt = made
                }
            }
            work += 1
            // Delivered after the removal: a note to oneself puts its receipt in this queue.
            guard let receipt else { continue }
            // The sender's shard as the receipt carries it: no hash per receipt.
            if Int(receipt.senderShard) == shardMap.index {
                let delivered = deliverReceipt(receipt, recipientDevice: device.deviceID, serverTime: currentWall, into: &effects)
                work += delivered.copies
                for step in delivered.next { next.handOn(step) }
            } else {
                let made = ReceiptBatch.Receipt(receipt: receipt, recipientDevice: device.deviceID, serverTime: currentWall)
                next.handOn(made, for: receipt.sender, shard: Int(receipt.senderShard), in: &self)
            }
        }
        if sharesTracked {
            trackedSharesRemoved(removedMessages, from: shareQueue, count: device.queue.count, events: device.forEachEvent)
        }
    }

    /// A batch of receipts for a sender this shard holds (`ShardStep.receipts`), the oldest
    /// first: each queues MESSAGE_DELIVERED to every device of the sender (at most a chunk
    /// of them in this hold, the rest by the receipt's own step, `DeviceBroadcast`). Stops
    /// after `ackChunk` copies (at least one receipt per hold, as `takeAcknowledgedChunk`
    /// counts its own shard's), returning the rest as the first step handed on, which its
    /// runner runs before anything else for this shard (`Switchboard.drive`), then the
    /// receipts' own steps: the sender's devices get the receipts in the batch's order
    /// (a receipt made while another's copies are still going out waits for them).
    mutating func deliverReceipts(_ batch: ReceiptBatch, into effects: inout [SwitchboardEffect]) -> StepOutcome {
        var work = 0
        var delivered = 0
        var broadcasts: [ShardStep] = []
        for item in batch.receipts {
            guard work < configuration.ackChunk else { break }
            let made = deliverReceipt(item.receipt, recipientDevice: item.recipientDevice, serverTime: item.serverTime, into: &effects)
            work += max(1, made.copies)
            if !made.next.isEmpty { broadcasts += made.next }  // usually empty: no call
            delivered += 1
        }
        guard delivered < batch.receipts.count else { return StepOutcome(reply: nil, next: broadcasts) }
        let rest = ReceiptBatch(sender: batch.sender, receipts: Array(batch.receipts[delivered...]))
        return StepOutcome(reply: nil, next: [.receipts(rest)] + broadcasts)
    }
}
