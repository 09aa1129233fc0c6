import SignalingProtocol
import SignalingSupport

/// A message being queued to a recipient with more devices than one hold of its shard may
/// take (`SwitchboardState.fanOutChunk`): the fan-out goes on in holds of its own, a chunk
/// of devices each, driven by a `ShardStep.continueFanOut` (docs/ARCHITECTURE.md, "Routing
/// shards").
///
/// All or nothing, like one hold: the event is one object shared by every device's queue,
/// queued chunk by chunk with `QueuedEvent.awaitsDecision` set, so each copy takes its room
/// and its place in its device's order at once while no device's pump writes it. The chunk
/// that reaches the last device decides: accepted, the one flag is cleared and every copy
/// is writable at the same moment (the wake-ups follow, a chunk a hold); refused (a full
/// queue, the sender's share), the one event is cancelled, so no copy is ever written, and
/// the copies are withdrawn a chunk a hold, their numbers holes.
///
/// Order: a recipient has at most one fan-out in progress (`UserActivity.fanOut`), and every
/// other message to that user waits until it is finished, helping it along meanwhile (each
/// of its holds runs the next chunk), so messages reach every device of a user in the same
/// order, and a sender's messages in the order their fan-outs started.
///
/// The devices are those the user has when the fan-out starts: it walks the user's device
/// list from its head, and devices are added at the head. A device forgotten meanwhile is
/// skipped (`forget`).
///
/// With a store, every hold of the fan-out, whichever message's thread runs it (its own
/// `continueFanOut` steps, or another message's `helpFanOut`), hands its changes in as a unit
/// of this message's commit group (`committedWith`), which the thread that started it closes
/// after the step that finds it finished: the writer commits every chunk's copies in one
/// transaction with the sender's id, and the OK follows that commit; a refusal by the store
/// drops or withdraws all of them (docs/ARCHITECTURE.md, "Commits across shards").
///
/// Guarded by the lock of the recipient's shard, like the records it points to.
final class FanOut: @unchecked Sendable {
    /// Names the fan-out in its shard (`SwitchboardState.fanOuts`) and in its steps.
    let id: UInt64
    let message: DeliveredMessage
    /// With a store, the message's deferred OK, whose commit group every hold of the
    /// fan-out joins (nil without a store).
    let committedWith: DeferredReply?
    /// The MESSAGE event every device's queue shares.
    let event: QueuedEvent
    /// The next device to queue to (nil: every device has its copy).
    var cursor: DeviceRecord?
    /// Each device the copy went to, with its number there, one array per chunk in
    /// queueing order. Each chunk's array is emptied by the hold that wakes its devices (or
    /// withdraws their copies), so that no hold releases more than a chunk's references
    /// (freeing 10,000 at once took about 100 µs).
    var copiedTo: [[(device: DeviceRecord, seq: UInt64)]] = []
    /// Devices of `copiedTo` forgotten since (their queues were counted out with them).
    var forgotten: Set<ObjectIdentifier> = []
    var phase = Phase.queueing
    /// The answer to the sender, once decided.
    var reply: Result<UInt64, RequestError>?

    enum Phase {
        /// Copies are queued from `cursor` on, undecided.
        case queueing
        /// Accepted: the devices of the chunks of `copiedTo` from this one on are still to
        /// be woken.
        case announcing(chunk: Int)
        /// Refused: the copies of the chunks of `copiedTo` from this one on are still to be
        /// withdrawn.
        case withdrawing(chunk: Int)
        /// Done; the answer waits for the step that started it (`ShardStep.continueFanOut`).
        case finished
    }

    init(id: UInt64, message: DeliveredMessage, event: QueuedEvent, first: DeviceRecord?, committedWith: DeferredReply?) {
        self.id = id
        self.message = message
        self.committedWith = committedWith
        self.event = event
        self.cursor = first
    }

    /// `device` is being forgotten (unlinked from its user's list): the walk steps over it,
    /// and its copy, if it has one, is left alone.
    func forget(_ device: DeviceRecord) {
        if cursor === device { cursor = device.next }
        forgotten.insert(ObjectIdentifier(device))
    }
}

extension SwitchboardState {
    /// How many devices one hold of a shard queues a message to, wakes, or withdraws it
    /// from (and rings a call on, `ringChunk`, or tells of a call's end, `DeviceBroadcast`,
    /// or how many held messages it claims, `HeldClaim`: the same cost per event). A fan-out costs about 0.5 µs per device in one hold (1,000 devices ≈ 524 µs,
    /// 10,000 ≈ 3 ms, measured with `Tools/bench-lock-holds`), during which every loop that
    /// needs the recipient's shard waits; 128 devices keep a hold near 60 µs, while the
    /// extra hold and step per chunk (a lock round and a dictionary lookup, well under a
    /// microsecond) stay under 1 % of the chunk's work.
    static let fanOutChunk = 128

    /// Whether a message to `recipient` must go through `fanOut` steps rather than be
    /// queued in the hold that admits it: the user has more devices than one chunk, or a
    /// fan-out to the user is in progress (a message must not overtake it), or a claim of
    /// the user's held messages (`awaitsClaim`: the message goes after them). With a store
    /// too: the chunks' units form the message's commit group (`FanOut.committedWith`).
    func fansOutInChunks(to recipient: String) -> Bool {
        if activities[recipient]?.fanOut != nil || awaitsClaim(recipient) { return true }
        var count = 0
        for _ in devices(of: recipient) {
            count += 1
            if count > configuration.fanOutChunk { return true }
        }
        return false
    }

    /// Starts the fan-out of `message` (its sender's shard has admitted it) to a recipient
    /// with more than a chunk of devices, none in progress: queues the first chunk and hands
    /// on the step that queues the rest. With a store, the current hold's unit belongs to
    /// the message's deferred OK already (`Switchboard.run`): the fan-out keeps it for its
    /// later holds, and its event is the message's part in this shard (`DeferredReply.add`:
    /// a refusal by the store cancels it, even while chunks are still being queued).
    mutating func startFanOut(_ message: DeliveredMessage, now: Instant) -> StepOutcome {
        let event = messageEvent(message)
        event.awaitsDecision = true
        nextFanOutID += 1
        let fanOut = FanOut(
            id: nextFanOutID, message: message, event: event, first: users[message.recipient],
            committedWith: deferredMessage)
        fanOuts[fanOut.id] = fanOut
        activity(message.recipient).fanOut = fanOut
        var outcome = continueFanOut(message.recipient, id: fanOut.id, now: now)
        outcome.queued = event
        return outcome
    }

    /// The step that started fan-out `id` runs its next chunk, or takes its answer when
    /// another message's holds have finished it.
    mutating func continueFanOut(_ recipient: String, id: UInt64, now: Instant) -> StepOutcome {
        guard let fanOut = fanOuts[id] else {
            return .answered(.failure(RequestError(.internalError, "fan-out \(id) to \(recipient) is gone")))
        }
        var outcome = advance(fanOut, now: now)
        if case .finished = fanOut.phase {
            fanOuts[id] = nil
            outcome.reply = fanOut.reply
        } else {
            outcome.next.append(.continueFanOut(recipient: recipient, id: id))
        }
        return outcome
    }

    /// A message to a user whose fan-out is in progress waits for it: this hold runs that
    /// fan-out's next chunk, and the message tries again in a hold of its own.
    mutating func helpFanOut(_ fanOut: FanOut, before message: ShardStep, now: Instant) -> StepOutcome {
        var outcome = advance(fanOut, now: now)
        outcome.reply = nil  // the other fan-out's answer is its own step's (`continueFanOut`)
        outcome.next.append(message)
        return outcome
    }

    /// One chunk of `fanOut`'s current phase. Returns the steps its decision hands on (the
    /// sender's shard settles its copies); the answer is in `fanOut.reply` once finished.
    /// With a store, the hold's changes are a unit of the fan-out's message, whichever
    /// message's step runs it (a hold that helps another message's fan-out does nothing
    /// else: that message tries again in a hold of its own).
    private mutating func advance(_ fanOut: FanOut, now: Instant) -> StepOutcome {
        if let message = fanOut.committedWith { deferReply(message, answers: false, queued: nil) }
        switch fanOut.phase {
        case .queueing: return queueChunk(of: fanOut, now: now)
        case .announcing(let chunk):
            if chunk < fanOut.copiedTo.count {
                for (device, seq) in fanOut.copiedTo[chunk] where isLiveCopy(of: fanOut, device, seq) {
                    announce(device, about: fanOut.event)
                }
                fanOut.copiedTo[chunk] = []
            }
            if chunk + 1 < fanOut.copiedTo.count { fanOut.phase = .announcing(chunk: chunk + 1) } else { finish(fanOut) }
        case .withdrawing(let chunk):
            if chunk < fanOut.copiedTo.count {
                for (device, seq) in fanOut.copiedTo[chunk] where isLiveCopy(of: fanOut, device, seq) {
                    // As if never queued (its number a hole); a pump stopped before it goes on.
                    withdraw(fanOut.event, seq: seq, from: device)
                    if device.isOnline { announce(device, about: fanOut.event) }
                }
                fanOut.copiedTo[chunk] = []
            }
            if chunk + 1 < fanOut.copiedTo.count { fanOut.phase = .withdrawing(chunk: chunk + 1) } else { finish(fanOut) }
        case .finished: break
        }
        return StepOutcome(reply: nil)
    }

    /// Queues the copy to the next chunk of devices, all or none of them, and decides the
    /// message when it has reached the last device or found one it cannot take.
    private mutating func queueChunk(of fanOut: FanOut, now: Instant) -> StepOutcome {
        let message = fanOut.message
        var chunk: [DeviceRecord] = []
        chunk.reserveCapacity(configuration.fanOutChunk)
        var next = fanOut.cursor
        while chunk.count < configuration.fanOutChunk, let device = next {
            next = device.next
            // A note to oneself skips the sending device, as `send` does.
            if message.recipient == message.sender && device.deviceID == message.senderDevice { continue }
            chunk.append(device)
        }
        if let full = chunk.first(where: { !hasRoom($0) }) {
            return decide(fanOut, .failure(backlogFull(full)), now: now)
        }
        if let refusal = checkSenderShare(message.sender, recipient: message.recipient, devices: chunk) {
            counters.refusedSenderQuota += 1
            return decide(fanOut, .failure(refusal), now: now)
        }
        var copied: [(device: DeviceRecord, seq: UInt64)] = []
        copied.reserveCapacity(chunk.count)
        for device in chunk where enqueue(fanOut.event, to: device) { copied.append((device, device.lastSeq)) }
        fanOut.copiedTo.append(copied)
        fanOut.cursor = next
        guard next == nil else { return StepOutcome(reply: nil) }
        return decide(fanOut, .success(message.serverTime), now: now)
    }

    /// Accepted: every copy becomes writable at once (one flag of the one event), and the
    /// devices are woken from the next hold on. Refused: no copy will ever be written (the
    /// event is cancelled), and they are withdrawn from the next hold on. Either way the
    /// sender's shard settles its own copies now.
    private mutating func decide(_ fanOut: FanOut, _ reply: Result<UInt64, RequestError>, now: Instant) -> StepOutcome {
        fanOut.reply = reply
        fanOut.event.awaitsDecision = false
        let accepted: Bool
        if case .success = reply {
            accepted = true
            counters.messagesAccepted += 1
            fanOut.phase = .announcing(chunk: 0)
        } else {
            accepted = false
            // Refused by the store meanwhile (`cancelMessage`), which counted it out of the
            // accepted messages: it never was one.
            if fanOut.event.isCancelled { counters.messagesAccepted += 1 }
            fanOut.event.isCancelled = true
            fanOut.phase = .withdrawing(chunk: 0)
        }
        return handOn(.settleMessage(fanOut.message, accepted: accepted), now: now)
    }

    /// Every device is woken or withdrawn: other messages to the user may go on.
    private mutating func finish(_ fanOut: FanOut) {
        fanOut.phase = .finished
        let recipient = fanOut.message.recipient
        if activities[recipient]?.fanOut === fanOut { activities[recipient]?.fanOut = nil }
        compactActivity(recipient)
    }

    /// Whether `device` still holds `fanOut`'s copy under `seq` (not forgotten, not
    /// acknowledged beyond by a client that acknowledged what it was never sent).
    private func isLiveCopy(of fanOut: FanOut, _ device: DeviceRecord, _ seq: UInt64) -> Bool {
        !fanOut.forgotten.contains(ObjectIdentifier(device)) && device.queue.event(seq) === fanOut.event
    }
}
