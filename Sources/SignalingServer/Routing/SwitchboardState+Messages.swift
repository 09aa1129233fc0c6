import SignalingProtocol
import SignalingSupport

/// The outcome of a MESSAGE_SEND that was not refused (yet).
struct MessageAcceptance {
    /// The server timestamp for OK (the original one for a duplicate).
    let serverTime: UInt64
    /// The queued event (nil for a duplicate): cancelled if its commit fails. With a
    /// `handOff`, the copy queued to the sender's other devices (nil: it has none).
    let event: QueuedEvent?
    /// The recipient is on another shard: the sender's side admitted the message, and this
    /// step, run on the recipient's shard, queues or refuses it and answers the request.
    var handOff: ShardStep? = nil
    /// The message's copies to the sender's other devices, when they go a chunk per hold
    /// (`startCopies`): their later holds are units of the message too (`deferReply`).
    var copies: FanOut? = nil
}

/// Message routing (docs/PROTOCOL.md 6.2): de-duplication, all-or-nothing fan-out,
/// holding for users with no known device.
///
/// Across shards a message is three steps, all-or-nothing like one hold: the sender's shard
/// checks what it holds (the message id, the sender's rate, room in the sender's other
/// devices), claims the id and queues the copies to the sender's other devices, not to be
/// written yet (`QueuedEvent.awaitsDecision`: they take their room and their place in each
/// device's order now, so nothing that happens before the decision can crowd them out);
/// the recipient's shard queues it to the recipient's devices (or holds it), or refuses it,
/// and answers; the sender's shard then releases the copies and remembers the id, or
/// withdraws the copies (never written, their numbers holes) and frees the id.
/// A repeat of the id before the decision is refused (`rateLimited`): an OK for it could
/// still turn out wrong, and the client's retry a moment later gets the decided answer.
extension SwitchboardState {
    /// Accepts a message from a device and queues it to the recipient's devices and to the
    /// sender's other devices.
    mutating func send(
        _ message: OutgoingMessage, from device: DeviceRecord, now: Instant, into effects: inout [SwitchboardEffect]
    ) -> Result<MessageAcceptance, RequestError> {
        assertOwns(device)
        return send(message, sender: device.userID, senderDevice: device.deviceID, sendingDevice: device, now: now, into: &effects)
    }

    /// Accepts a message from `sender` (a device of it, `sendingDevice`, or a system sender
    /// of the admin API with none) and queues it to the recipient's devices and, for
    /// multi-device sync, to the sender's devices other than the sending one: every device
    /// of a user sees the messages the user sent. Within one shard all of them share one
    /// event, so a cancelled message is cancelled everywhere; only the recipient's
    /// acknowledgements produce receipts (`acknowledge`).
    mutating func send(
        _ message: OutgoingMessage, sender: String, senderDevice: String, sendingDevice: DeviceRecord?, now: Instant,
        into effects: inout [SwitchboardEffect]
    ) -> Result<MessageAcceptance, RequestError> {
        // Each user's activity and device list are looked up once here, a hash of the id
        // each (the checks below looked them up again: about 1,500 instructions per message,
        // callgrind, issue 16). `admitSender` may create the sender's activity after this
        // look-up: nil then stands for it, since a new activity holds nothing the checks
        // below look at.
        let senderActivity = activities[sender]
        if senderActivity?.undecidedMessages[message.messageID] != nil {
            return .failure(RequestError(
                .rateLimited, "message \(message.messageID) is still being decided by its recipient's shard; retry"))
        }
        if let original = senderActivity?.recentMessageIDs[message.messageID] {
            counters.messagesDeduplicated += 1
            return .success(MessageAcceptance(serverTime: original, event: nil))
        }
        if let refusal = admitSender(sender, bytes: message.body.count, now: now) { return .failure(refusal) }
        let delivered = DeliveredMessage(
            messageID: message.messageID, sender: sender, senderDevice: senderDevice,
            recipient: message.recipient, contentType: message.contentType, body: message.body,
            serverTime: currentWall)
        // A note to oneself already reaches the sender's other devices as the recipient's.
        let syncs = message.recipient != sender
        let senderDevices = devices(of: sender)
        // More copies than one hold takes: a chunk a hold, then the recipient's side as a step.
        if syncs && copiesInChunks(senderActivity, senderDevices, sending: sendingDevice) {
            return startCopies(of: delivered, sending: sendingDevice, into: &effects)
        }
        let copies = syncs ? senderDevices.filter { $0 !== sendingDevice } : []
        // The recipient's, when this shard holds it (the sender's for a note to oneself).
        let recipient: (activity: UserActivity?, devices: DeviceList)? = !shardMap.owns(message.recipient)
            ? nil : syncs ? (activities[message.recipient], devices(of: message.recipient)) : (senderActivity, senderDevices)
        // To another shard's user, or to one whose fan-out takes several holds: the recipient's
        // side is a step of its own (`deliverMessage`).
        guard let recipient, !fansOutInChunks(recipient.activity, recipient.devices) else {
            if let full = copies.first(where: { !hasRoom($0) }) { return .failure(backlogFull(full)) }
            let undecided = queueUndecidedCopies(of: delivered, to: copies, into: &effects)
            activity(sender).undecidedMessages[message.messageID] = undecided
            return .success(MessageAcceptance(
                serverTime: delivered.serverTime, event: undecided.copy, handOff: .deliverMessage(MessageHandOff(delivered))))
        }
        let holdForUser = recipient.devices.first == nil
        let targets = recipient.devices.skipping(sendingDevice)
        if let refusal = refusalToQueue(delivered, targets: targets, copies: copies, holdForUser: holdForUser) {
            return .failure(refusal)
        }
        let event = messageEvent(delivered)
        queue(event, for: delivered.recipient, targets: targets, holdForUser: holdForUser, now: now, into: &effects)
        for copy in copies { enqueue(event, to: copy, into: &effects) }
        rememberMessageID(
            message.messageID, sender: sender, serverTime: delivered.serverTime, now: now,
            in: senderActivity ?? activity(sender))
        counters.messagesAccepted += 1
        return .success(MessageAcceptance(serverTime: delivered.serverTime, event: event))
    }

    /// With a store, an accepted message's OK waits for its commit ("accepted" is a
    /// promise): ties this hold's commit unit to the reply `make` builds, and returns it
    /// (nil without a store, and for a duplicate, answered at once). For a message handed
    /// on to another shard (`handOff`), this is its first step's unit, and
    /// `Switchboard.runMessage` takes the reply on to the others.
    mutating func deferReply(of acceptance: MessageAcceptance, _ make: () -> DeferredReply) -> DeferredReply? {
        guard journaling, acceptance.event != nil || acceptance.handOff != nil else { return nil }
        let reply = make()
        // Made here, so no other thread has it yet: its first part needs no queue.
        if let event = acceptance.event { reply.addFirst(event, shard: shardMap.index) }
        deferReply(reply, answers: acceptance.handOff == nil, queued: nil)
        // Copies in chunks: every later hold of them is a unit of this message too.
        acceptance.copies?.committedWith = reply
        return reply
    }

    /// The recipient's step of a message from another shard's user: queued to every device
    /// of the recipient (or held), or refused with nothing queued.
    /// A recipient with more devices than one hold takes gets them in chunks (`FanOut`), and
    /// a message to a user whose fan-out, or claim of held messages, is in progress waits
    /// for it.
    mutating func deliverMessage(_ handOff: MessageHandOff, now: Instant, into effects: inout [SwitchboardEffect]) -> StepOutcome {
        let message = handOff.message
        // The recipient's activity and devices, looked up once (as in `send`).
        let activity = activities[message.recipient]
        let devices = devices(of: message.recipient)
        // After every message held for the user (`HeldClaim`).
        if awaitsClaim(activity, devices) { return helpClaim(of: message.recipient, before: .deliverMessage(handOff), into: &effects) }
        if let inProgress = activity?.fanOut {
            return helpFanOut(inProgress, before: .deliverMessage(handOff), into: &effects)
        }
        if fansOutInChunks(activity, devices) { return startFanOut(message, now: now, into: &effects) }
        // A note to oneself skips the sending device, as `send` does (it comes here when it
        // waited for a claim or a fan-out). The list walked, not copied into an array: an
        // array was an allocation and a retain and a release of every device per message
        // that crosses shards, made on the recipient's core.
        let sending = message.recipient == message.sender ? devices.first(where: { $0.deviceID == message.senderDevice }) : nil
        let targets = devices.skipping(sending)
        let holdForUser = devices.first == nil
        let accepted: Bool
        var outcome: StepOutcome
        if let refusal = refusalToQueue(message, targets: targets, copies: [], holdForUser: holdForUser) {
            accepted = false
            outcome = .answered(.failure(refusal))
        } else {
            let event = messageEvent(message)
            queue(event, for: message.recipient, targets: targets, holdForUser: holdForUser, now: now, into: &effects)
            counters.messagesAccepted += 1
            accepted = true
            outcome = .answered(.success(message.serverTime))
            outcome.queued = event
        }
        outcome.merge(handOn(.settleMessage(handOff, accepted: accepted), now: now, into: &effects))
        return outcome
    }

    /// The sender's first step of a message to another shard's user: its copy queued to
    /// each of `copies` (which have room, and fit in one hold), not to be written before
    /// the decision.
    private mutating func queueUndecidedCopies(
        of message: DeliveredMessage, to copies: [DeviceRecord], into effects: inout [SwitchboardEffect]
    ) -> UndecidedMessage {
        guard !copies.isEmpty else { return UndecidedMessage(serverTime: message.serverTime) }
        let copy = messageEvent(message)
        copy.awaitsDecision = true
        var copiedTo: [(device: DeviceRecord, seq: UInt64)] = []
        for device in copies where enqueue(copy, to: device, into: &effects) { copiedTo.append((device, device.lastSeq)) }
        return UndecidedMessage(serverTime: message.serverTime, copy: copy, copiedTo: copiedTo)
    }

    /// The sender's last step of a message to another shard's user: the copies queued in
    /// its first step go out and its id is remembered, or (refused) the copies are
    /// cancelled and the id is free again. Nothing if the sender was forgotten meanwhile.
    /// Copies that went in chunks are woken or withdrawn in chunks too, by the returned step
    /// (`settleCopies`).
    mutating func settleMessage(
        _ message: DeliveredMessage, accepted decided: Bool, now: Instant, into effects: inout [SwitchboardEffect]
    ) -> StepOutcome {
        guard let activity = activities[message.sender],
            let undecided = activity.undecidedMessages.removeValue(forKey: message.messageID)
        else { return StepOutcome(reply: nil) }
        let accepted = decided && !undecided.refusedByStore
        var outcome = StepOutcome(reply: nil)
        if let copies = undecided.copies {
            outcome = settleCopies(copies, accepted: accepted)
        } else if let copy = undecided.copy {
            copy.awaitsDecision = false
            if !accepted { copy.isCancelled = true }
            // Devices forgotten meanwhile are left alone (their queues were counted out).
            let known = KnownDevices(of: message.sender, in: self, checking: undecided.copiedTo.count)
            for (device, seq) in undecided.copiedTo where known.contains(device) {
                if accepted {
                    if device.queue.event(seq) === copy { announce(device, about: copy, into: &effects) }
                } else {
                    // Refused: as if never queued (its number stays a hole), and the
                    // device's pump, stopped before it, goes on.
                    withdraw(copy, seq: seq, from: device)
                    if device.isOnline { announce(device, about: copy, into: &effects) }
                }
            }
        }
        if accepted {
            rememberMessageID(message.messageID, sender: message.sender, serverTime: message.serverTime, now: now, in: activity)
        } else {
            compactActivity(message.sender)
        }
        return outcome
    }

    /// Why `message` cannot be queued to `targets` and `copies` (or held for its recipient,
    /// `holdForUser`) now; nil if it can. Checks a full queue first (the recipient's
    /// state), then the sender's share of it.
    private mutating func refusalToQueue(
        _ message: DeliveredMessage, targets: some Sequence<DeviceRecord>, copies: [DeviceRecord], holdForUser: Bool
    ) -> RequestError? {
        // All or nothing: a message is either queued to every target or refused. (Two
        // walks, not one of `targets + copies`: no array made per message.)
        if let full = targets.first(where: { !hasRoom($0) }) ?? copies.first(where: { !hasRoom($0) }) {
            return backlogFull(full)
        }
        if holdForUser, (activities[message.recipient]?.held.count ?? 0) >= configuration.maxPendingEvents {
            return RequestError(
                .recipientBacklogFull, "\(message.recipient) has too many messages waiting for a first device; retry later")
        }
        if let refusal = checkSenderShare(message.sender, recipient: message.recipient, devices: targets) {
            counters.refusedSenderQuota += 1
            return refusal
        }
        return nil
    }

    func backlogFull(_ device: DeviceRecord) -> RequestError {
        RequestError(
            .recipientBacklogFull,
            "device \(device.deviceID) of \(device.userID) has \(device.queue.count) unacknowledged events; retry later")
    }

    /// The MESSAGE event of `message`, with the receipt its recipient's acknowledgement makes.
    func messageEvent(_ message: DeliveredMessage) -> QueuedEvent {
        makeEvent(
            .message(message),
            receipt: DeliveryReceipt(
                sender: message.sender, messageID: message.messageID, recipient: message.recipient, shards: shardMap))
    }

    /// Queues `event` to the recipient's `targets`, or holds it for the recipient, which
    /// has no device (`holdForUser`).
    private mutating func queue(
        _ event: QueuedEvent, for recipient: String, targets: some Sequence<DeviceRecord>, holdForUser: Bool, now: Instant,
        into effects: inout [SwitchboardEffect]
    ) {
        if holdForUser {
            hold(event, for: recipient, now: now)
        } else {
            for target in targets { enqueue(event, to: target, into: &effects) }
        }
    }

    /// Records `queued`, the event this hold queued for `message`, as one of the message's
    /// parts (with a store, in `Switchboard.run`). If the writer refused the message
    /// meanwhile (its store deadline), its cancellation may have passed this shard before
    /// the event was queued here: the event is cancelled at once, before anything can
    /// write it (`--delivery immediate` writes after the hold). The parts' queue orders
    /// this against the refusing thread, which settles first and then takes the parts,
    /// closing the queue: either the push came first and the cancellation has the event,
    /// or the push is refused and the event is cancelled here. (A message is accepted only
    /// once its group is closed, after its last part: a refused push is a refused message.)
    mutating func recordPart(_ queued: QueuedEvent, of message: DeferredReply) {
        guard !message.add(queued, shard: shardMap.index) else { return }
        if message.isRefused { cancelMessage([queued], sender: message.sender, messageID: message.messageID) }
    }

    /// The store could not commit an accepted message in time: it was refused after all.
    /// Its events are never written to anyone, and the sender may send it again. Run on
    /// every shard the message touched (those of its parts, `DeferredReply.takeParts`, and
    /// the sender's), with the message's events of this shard (`events`): the sender's
    /// shard frees the id, the recipient's counts the cancellation.
    mutating func cancelMessage(_ events: [QueuedEvent], sender: String, messageID: String) {
        if shardMap.owns(sender) {
            activities[sender]?.recentMessageIDs[messageID] = nil
            // Still being decided (a fan-out's chunks under way): its settle step must not
            // remember the id after all.
            activities[sender]?.undecidedMessages[messageID]?.refusedByStore = true
            compactActivity(sender)
        }
        for event in events where !event.isCancelled {
            event.isCancelled = true
            guard let recipient = event.receipt?.recipient, shardMap.owns(recipient) else { continue }
            // A message held for a user with no device may have been claimed by that user's
            // first device meanwhile: that copy was journaled with the handshake, in another
            // commit unit, which may be committed although this message is refused. Withdraw
            // it. (Copies journaled with the message itself go, or are undone, with its units.)
            if journaling && event.wasClaimed {
                for device in devices(of: recipient) {
                    device.queue.forEach(after: device.ackedSeq) { seq, queued in
                        guard queued === event else { return true }
                        journal(.withdrawEvent(user: device.userID, device: device.deviceID, seq: seq))
                        return false
                    }
                }
            }
            counters.messagesCancelled += 1
            counters.messagesAccepted -= 1
        }
    }
}

/// Which records are still devices of a user, for a step that holds records it took from
/// the user's list in an earlier hold (a device may have been forgotten since). For a few
/// records, a walk of the list each; for more, one walk into a set (a walk per record made
/// the settle step of a message from a user with 1,000 devices take 11 ms).
struct KnownDevices {
    private let list: DeviceList
    private let set: Set<ObjectIdentifier>?

    /// `count`: how many records will be checked.
    init(of userID: String, in state: SwitchboardState, checking count: Int) {
        list = state.devices(of: userID)
        set = count > 4 ? Set(list.lazy.map { ObjectIdentifier($0) }) : nil
    }

    func contains(_ device: DeviceRecord) -> Bool {
        if let set { return set.contains(ObjectIdentifier(device)) }
        return list.contains { $0 === device }
    }
}
