import SignalingProtocol
import SignalingSupport

/// A message's copy being queued to many devices of one user, a chunk of devices per hold of
/// the user's shard (`SwitchboardState.fanOutChunk`), driven by a `ShardStep.continueFanOut`
/// (docs/ARCHITECTURE.md, "Routing shards"). Two sides of a message use it (`Side`):
/// - the recipient's devices (the fan-out proper), when the recipient has more devices than
///   one hold may take: the chunk that reaches the last device decides the message;
/// - the sender's other devices (multi-device sync, docs/PROTOCOL.md 6.2), when the sender
///   has more of them than one hold may take: the copies are queued in the sender's shard
///   before the message goes on to the recipient's (`ShardStep.deliverMessage`), whose
///   decision the sender's settle step brings back (`settleMessage`). A hold of 1,000
///   copies took about 270 µs, the settle step that woke them about 190 µs.
///
/// All or nothing, like one hold: the event is one object shared by every device's queue,
/// queued chunk by chunk with `QueuedEvent.awaitsDecision` set, so each copy takes its room
/// and its place in its device's order at once while no device's pump writes it. Once the
/// message is decided: accepted, the one flag is cleared and every copy is writable at the
/// same moment (the wake-ups follow, a chunk a hold); refused (a full queue, the sender's
/// share, on either side), the one event is cancelled, so no copy is ever written, and the
/// copies are withdrawn a chunk a hold, their numbers holes.
///
/// Order: a recipient has at most one fan-out in progress (`UserActivity.fanOut`), and every
/// other message to that user waits until it is finished, helping it along meanwhile (each
/// of its holds runs the next chunk), so messages reach every device of a user in the same
/// order, and a sender's messages in the order their fan-outs started. On the sender's side,
/// a user's messages whose copies go in chunks queue them one message at a time, in the
/// order they were sent (`UserActivity.syncing`): the step of one waiting behind another
/// runs that one's next chunk in each of its holds (as a `DeviceBroadcast` waits), so every
/// device of the sender gets the user's messages in the order sent. A message whose copies
/// fit in one hold, with none in chunks ahead of it, is copied in its first hold as before.
///
/// The devices are those the user has when the fan-out starts: it walks the user's device
/// list from its head, and devices are added at the head. A device forgotten meanwhile is
/// skipped (`forget`).
///
/// With a store, every hold of the fan-out, whichever message's thread runs it (its own
/// `continueFanOut` steps, or another message's `helpFanOut` or waiting copies), hands its
/// changes in as a unit of this message's commit group (`committedWith`), which the thread
/// that started it closes after the step that finds it finished: the writer commits every
/// chunk's copies in one transaction with the sender's id, and the OK follows that commit;
/// a refusal by the store drops or withdraws all of them (docs/ARCHITECTURE.md, "Commits
/// across shards").
///
/// Guarded by the lock of its user's shard, like the records it points to.
final class FanOut: @unchecked Sendable {
    /// Names the fan-out in its shard (`SwitchboardState.fanOuts`, or its sender's
    /// `UserActivity.copies`) and in its steps.
    let id: UInt64
    let message: DeliveredMessage
    let side: Side
    /// With a store, the message's deferred OK, whose commit group every hold of the
    /// fan-out joins (nil without a store; on the sender's side, set once the first hold
    /// has made it, `deferReply(of:_:)`).
    var committedWith: DeferredReply?
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
    /// The answer to the sender, once decided (on the sender's side: only a refusal).
    var reply: Result<UInt64, RequestError>?
    /// The recipient's side, decided: the sender's settle step, for the fan-out's own step
    /// to hand on (in its message's chain, whose group the settle's unit joins), whichever
    /// message's hold decided it.
    var settle: ShardStep?

    enum Side {
        /// The recipient's devices: the last chunk decides the message.
        case recipient
        /// The sender's devices but the sending one (`skipping`; nil for a system sender):
        /// the recipient's shard decides.
        case sender(skipping: DeviceRecord?)
    }

    enum Phase {
        /// Copies are queued from `cursor` on, undecided (on the sender's side, only by the
        /// first of the user's `syncing` fan-outs; the others wait for it).
        case queueing
        /// The sender's side: every copy is queued; the message is the recipient's shard's
        /// to decide (`handedOn`: the step that takes it there has been handed on).
        case awaitingDecision(handedOn: Bool)
        /// Accepted: the devices of the chunks of `copiedTo` from this one on are still to
        /// be woken.
        case announcing(chunk: Int)
        /// Refused: the copies of the chunks of `copiedTo` from this one on are still to be
        /// withdrawn.
        case withdrawing(chunk: Int)
        /// Done; the answer waits for the step that started it (`ShardStep.continueFanOut`).
        case finished
    }

    init(id: UInt64, message: DeliveredMessage, side: Side = .recipient, event: QueuedEvent, first: DeviceRecord?, committedWith: DeferredReply?) {
        self.id = id
        self.message = message
        self.side = side
        self.committedWith = committedWith
        self.event = event
        self.cursor = first
    }

    /// The user whose devices get the copies.
    var user: String {
        if case .sender = side { message.sender } else { message.recipient }
    }

    var isSenders: Bool {
        if case .sender = side { true } else { false }
    }

    /// Whether `device` gets no copy: the sending device, on either side (a note to
    /// oneself reaches the sender's other devices as the recipient's).
    func skips(_ device: DeviceRecord) -> Bool {
        switch side {
        case .recipient: message.recipient == message.sender && device.deviceID == message.senderDevice
        case .sender(let skipping): device === skipping
        }
    }

    /// `device` is being forgotten (unlinked from its user's list): the walk steps over it,
    /// and its copy, if it has one, is left alone.
    func forget(_ device: DeviceRecord) {
        if cursor === device { cursor = device.next }
        forgotten.insert(ObjectIdentifier(device))
    }
}

extension UserActivity {
    /// `device` was unlinked from the user's list (`next` not cleared yet): no fan-out of
    /// the user's, to its devices or of its messages' copies, queues to it or touches its copy.
    func fanOutDeviceForgotten(_ device: DeviceRecord) {
        fanOut?.forget(device)
        for copying in copies.values { copying.forget(device) }
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
    /// `activity` and `devices`: the recipient's, looked up by the caller (no hash of its id here).
    func fansOutInChunks(_ activity: UserActivity?, _ devices: DeviceList) -> Bool {
        if activity?.fanOut != nil || awaitsClaim(activity, devices) { return true }
        return hasMoreThanAChunk(devices, besides: nil)
    }

    /// Whether a message from a sender (`activity`, `devices`: its own, looked up by the
    /// caller), sent by `sending`, must queue its copies to the sender's other devices a
    /// chunk per hold (`FanOut`, the sender's side): it has more of them than one chunk,
    /// or messages of the user are copied in chunks already (this one must not overtake
    /// them).
    func copiesInChunks(_ activity: UserActivity?, _ devices: DeviceList, sending: DeviceRecord?) -> Bool {
        if !(activity?.syncing.isEmpty ?? true) { return true }
        return hasMoreThanAChunk(devices, besides: sending)
    }

    /// Whether `devices` are more than one chunk, `besides` not counted: a walk of at
    /// most a chunk and one.
    private func hasMoreThanAChunk(_ devices: DeviceList, besides: DeviceRecord?) -> Bool {
        var count = 0
        for device in devices where device !== besides {
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
    mutating func startFanOut(_ message: DeliveredMessage, now: Instant, into effects: inout [SwitchboardEffect]) -> StepOutcome {
        let event = messageEvent(message)
        event.awaitsDecision = true
        nextFanOutID += 1
        let fanOut = FanOut(
            id: nextFanOutID, message: message, event: event, first: users[message.recipient],
            committedWith: deferredMessage)
        fanOuts[fanOut.id] = fanOut
        activity(message.recipient).fanOut = fanOut
        var outcome = continueFanOut(message.recipient, id: fanOut.id, now: now, into: &effects)
        outcome.queued = event
        return outcome
    }

    /// The sender's first hold of `message` (admitted: no duplicate, within its rate),
    /// whose copies to the sender's other devices go a chunk per hold (`copiesInChunks`):
    /// queues the first chunk, unless other messages of the user are still being copied
    /// (it waits behind them), and claims the id until the recipient's shard decides.
    /// Returns the step that queues the rest and then takes the message to the recipient's
    /// shard; or the refusal, with nothing queued, if the first chunk found a full queue.
    mutating func startCopies(
        of message: DeliveredMessage, sending: DeviceRecord?, into effects: inout [SwitchboardEffect]
    ) -> Result<MessageAcceptance, RequestError> {
        let event = messageEvent(message)
        event.awaitsDecision = true
        nextFanOutID += 1
        let fanOut = FanOut(
            id: nextFanOutID, message: message, side: .sender(skipping: sending), event: event, first: users[message.sender],
            committedWith: nil)
        let activity = activity(message.sender)
        activity.copies[fanOut.id] = fanOut
        activity.syncing.push(fanOut)
        activity.undecidedMessages[message.messageID] = UndecidedMessage(serverTime: message.serverTime, copies: fanOut)
        if activity.syncing.count == 1 { queueChunk(of: fanOut, into: &effects) }
        if case .withdrawing = fanOut.phase, case .failure(let refusal)? = fanOut.reply {
            // Refused by the first chunk, which queued nothing: as one hold would.
            finish(fanOut)
            return .failure(refusal)
        }
        return .success(MessageAcceptance(
            serverTime: message.serverTime, event: event, handOff: nextStep(ofCopies: fanOut), copies: fanOut))
    }

    /// The step that carries copying `fanOut` on: the message itself, to the recipient's
    /// shard, once every copy is queued; else the next chunk.
    private func nextStep(ofCopies fanOut: FanOut) -> ShardStep {
        guard case .awaitingDecision(handedOn: false) = fanOut.phase else {
            return .continueFanOut(user: fanOut.user, id: fanOut.id)
        }
        fanOut.phase = .awaitingDecision(handedOn: true)
        return .deliverMessage(MessageHandOff(fanOut.message))
    }

    /// The step that started fan-out `id` (to `user`'s devices, or of `user`'s message to
    /// its other devices) runs its next chunk, or takes its answer when another message's
    /// holds have finished it.
    mutating func continueFanOut(_ user: String, id: UInt64, now: Instant, into effects: inout [SwitchboardEffect]) -> StepOutcome {
        if let copies = activities[user]?.copies[id] { return continueCopies(copies, into: &effects) }
        guard let fanOut = fanOuts[id] else {
            return .answered(.failure(RequestError(.internalError, "fan-out \(id) to \(user) is gone")))
        }
        advance(fanOut, into: &effects)
        var outcome = StepOutcome(reply: nil)
        if let settle = fanOut.settle.take() { outcome.merge(handOn(settle, now: now, into: &effects)) }
        if case .finished = fanOut.phase {
            fanOuts[id] = nil
            outcome.reply = fanOut.reply
        } else {
            outcome.next.append(.continueFanOut(user: user, id: id))
        }
        return outcome
    }

    /// A step of the copies of a message to its sender's other devices: while they are
    /// being queued, the next chunk of the user's first message still being copied (its
    /// own, or the one it waits behind); once all are, the message goes to the recipient's
    /// shard (in this message's own chain, whichever step queued its last chunk); once it
    /// is decided (`settleMessage`), the next chunk to wake or withdraw.
    private mutating func continueCopies(_ fanOut: FanOut, into effects: inout [SwitchboardEffect]) -> StepOutcome {
        var outcome = StepOutcome(reply: nil)
        switch fanOut.phase {
        case .queueing:
            // (Never itself missing from the list while queueing; if it were, it goes on alone.)
            advance(activities[fanOut.user]?.syncing.first ?? fanOut, into: &effects)
        case .awaitingDecision: break
        default:
            advance(fanOut, into: &effects)
        }
        if case .finished = fanOut.phase {
            outcome.reply = fanOut.reply
        } else if case .awaitingDecision(handedOn: true) = fanOut.phase {
            // Cannot happen: the message's own step is the only one, and it has gone on.
        } else {
            outcome.next.append(nextStep(ofCopies: fanOut))
        }
        return outcome
    }

    /// A message to a user whose fan-out is in progress waits for it: this hold runs that
    /// fan-out's next chunk, and the message tries again in a hold of its own.
    mutating func helpFanOut(_ fanOut: FanOut, before message: ShardStep, into effects: inout [SwitchboardEffect]) -> StepOutcome {
        // The other fan-out's answer, and its settle step, are its own step's (`continueFanOut`).
        advance(fanOut, into: &effects)
        return StepOutcome(reply: nil, next: [message])
    }

    /// The sender's shard settles a message whose copies went in chunks: accepted, every
    /// copy is writable at once (one flag) and the devices are woken a chunk a hold from
    /// the returned step on; refused, none is ever written (the event is cancelled) and the
    /// copies are withdrawn the same way. This hold touches no device.
    mutating func settleCopies(_ fanOut: FanOut, accepted: Bool) -> StepOutcome {
        fanOut.event.awaitsDecision = false
        if accepted {
            fanOut.phase = .announcing(chunk: 0)
        } else {
            fanOut.event.isCancelled = true
            fanOut.phase = .withdrawing(chunk: 0)
        }
        return StepOutcome(reply: nil, next: [.continueFanOut(user: fanOut.user, id: fanOut.id)])
    }

    /// One chunk of `fanOut`'s current phase. What its decision hands on waits in the
    /// fan-out for its own step (`FanOut.settle`, or `Phase.awaitingDecision` on the
    /// sender's side); the answer is in `fanOut.reply` once finished. With a store, the
    /// hold's changes are a unit of the fan-out's message, whichever message's step runs it
    /// (a hold that helps another message's fan-out does nothing else: that message tries
    /// again in a hold of its own).
    private mutating func advance(_ fanOut: FanOut, into effects: inout [SwitchboardEffect]) {
        if let message = fanOut.committedWith { deferReply(message, answers: false, queued: nil) }
        switch fanOut.phase {
        case .queueing: queueChunk(of: fanOut, into: &effects)
        case .announcing(let chunk):
            if chunk < fanOut.copiedTo.count {
                for (device, seq) in fanOut.copiedTo[chunk] where isLiveCopy(of: fanOut, device, seq) {
                    announce(device, about: fanOut.event, into: &effects)
                }
                fanOut.copiedTo[chunk] = []
            }
            if chunk + 1 < fanOut.copiedTo.count { fanOut.phase = .announcing(chunk: chunk + 1) } else { finish(fanOut) }
        case .withdrawing(let chunk):
            if chunk < fanOut.copiedTo.count {
                for (device, seq) in fanOut.copiedTo[chunk] where isLiveCopy(of: fanOut, device, seq) {
                    // As if never queued (its number a hole); a pump stopped before it goes on.
                    withdraw(fanOut.event, seq: seq, from: device)
                    if device.isOnline { announce(device, about: fanOut.event, into: &effects) }
                }
                fanOut.copiedTo[chunk] = []
            }
            if chunk + 1 < fanOut.copiedTo.count { fanOut.phase = .withdrawing(chunk: chunk + 1) } else { finish(fanOut) }
        case .awaitingDecision, .finished: break
        }
    }

    /// Queues the copy to the next chunk of devices, all or none of them, and decides the
    /// message (the recipient's side), or ends the copying (the sender's), when it has
    /// reached the last device or found one it cannot take.
    private mutating func queueChunk(of fanOut: FanOut, into effects: inout [SwitchboardEffect]) {
        let message = fanOut.message
        var chunk: [DeviceRecord] = []
        chunk.reserveCapacity(configuration.fanOutChunk)
        var next = fanOut.cursor
        while chunk.count < configuration.fanOutChunk, let device = next {
            next = device.next
            if !fanOut.skips(device) { chunk.append(device) }
        }
        if let full = chunk.first(where: { !hasRoom($0) }) {
            return decide(fanOut, .failure(backlogFull(full)))
        }
        // A sender's share counts what it queues to others, not its own devices' copies.
        if !fanOut.isSenders, let refusal = checkSenderShare(message.sender, recipient: message.recipient, devices: chunk) {
            counters.refusedSenderQuota += 1
            return decide(fanOut, .failure(refusal))
        }
        var copied: [(device: DeviceRecord, seq: UInt64)] = []
        copied.reserveCapacity(chunk.count)
        for device in chunk where enqueue(fanOut.event, to: device, into: &effects) { copied.append((device, device.lastSeq)) }
        fanOut.copiedTo.append(copied)
        fanOut.cursor = next
        guard next == nil else { return }
        decide(fanOut, .success(message.serverTime))
    }

    /// The recipient's side: accepted, every copy becomes writable at once (one flag of the
    /// one event), and the devices are woken from the next hold on; refused, no copy will
    /// ever be written (the event is cancelled), and they are withdrawn from the next hold
    /// on. Either way the sender's shard settles its own copies: the settle step goes out
    /// with the fan-out's own step (`FanOut.settle`), at once if this hold is that step's,
    /// else from its next hold. (Handed on by a helping message's hold, it ran in that
    /// message's chain, and with a store remembered the id in that message's group.)
    /// The sender's side (`decideCopies`): the copying is over, the next message of the
    /// user's may start its own.
    private mutating func decide(_ fanOut: FanOut, _ reply: Result<UInt64, RequestError>) {
        if fanOut.isSenders { return decideCopies(fanOut, reply) }
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
        fanOut.settle = .settleMessage(MessageHandOff(fanOut.message), accepted: accepted)
    }

    /// The sender's side: every copy is queued (the message goes on to the recipient's
    /// shard from its own step, `nextStep(ofCopies:)`), or one cannot be: the message is
    /// refused here, nothing goes to the recipient, the copies are withdrawn from the next
    /// hold on (none is ever written) and the id is free again. Either way the user's next
    /// message waiting to be copied starts with the next step that runs.
    private mutating func decideCopies(_ fanOut: FanOut, _ result: Result<UInt64, RequestError>) {
        guard let activity = activities[fanOut.user] else { return }
        if activity.syncing.first === fanOut { activity.syncing.pop() }
        if case .failure = result {
            fanOut.reply = result
            fanOut.event.awaitsDecision = false
            fanOut.event.isCancelled = true
            fanOut.phase = .withdrawing(chunk: 0)
            activity.undecidedMessages[fanOut.message.messageID] = nil
        } else {
            fanOut.phase = .awaitingDecision(handedOn: false)
        }
    }

    /// Every device is woken or withdrawn: other messages to the user may go on.
    private mutating func finish(_ fanOut: FanOut) {
        fanOut.phase = .finished
        let user = fanOut.user
        if fanOut.isSenders {
            activities[user]?.copies[fanOut.id] = nil
        } else if activities[user]?.fanOut === fanOut {
            activities[user]?.fanOut = nil
        }
        compactActivity(user)
    }

    /// Whether `device` still holds `fanOut`'s copy under `seq` (not forgotten, not
    /// acknowledged beyond by a client that acknowledged what it was never sent).
    private func isLiveCopy(of fanOut: FanOut, _ device: DeviceRecord, _ seq: UInt64) -> Bool {
        !fanOut.forgotten.contains(ObjectIdentifier(device)) && device.queue.event(seq) === fanOut.event
    }
}
