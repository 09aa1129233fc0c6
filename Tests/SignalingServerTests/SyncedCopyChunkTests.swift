import SignalingProtocol
@testable import SignalingServer
import SignalingStore
import SignalingSupport
import Testing

/// A message's copies to its sender's other devices (multi-device sync) go a chunk per hold
/// of the sender's shard when there are more of them than a chunk (`FanOut`, the sender's
/// side): all queued before the message goes on to the recipient's shard, then woken or
/// withdrawn a chunk per hold once it is decided. alice has 300 devices (d0 sends); bob is
/// on the other shard, carol on alice's.
@Suite("A message's copies to its sender's other devices go a chunk per hold (routing core, pure)")
struct SyncedCopyChunkTests {
    static let chunk = SwitchboardState.fanOutChunk
    static let senderDevices = 300
    let alice = TwoShards.user("alice", onShard: 0)
    let bob = TwoShards.user("bob", onShard: 1)
    let carol = TwoShards.user("carol", onShard: 0)

    /// The message ids of the MESSAGE events `device` has, in queue order.
    func messages(_ device: DeviceRecord) -> [String] {
        TwoShards.events(device).compactMap { event in
            guard case .message(let message) = event else { return nil }
            return message.messageID
        }
    }

    /// The sequence numbers `device`'s pump would write now.
    func writable(_ state: SwitchboardState, _ device: DeviceRecord) -> [UInt64] {
        var written: [UInt64] = []
        _ = state.nextBatch(for: device, connection: device.connection!, after: 0, limit: 1_000) { seq, _ in
            written.append(seq)
            return true
        }
        return written
    }

    /// alice's devices (d0 first) and the recipient's one.
    func devices(_ shards: inout TwoShards, recipient: String) throws -> (alice: [DeviceRecord], recipient: DeviceRecord) {
        let senders = try (0..<Self.senderDevices).map { try shards.attach(alice, "d\($0)", slot: UInt32($0 + 10), at: 1) }
        return (senders, try shards.attach(recipient, slot: 1, at: 1))
    }

    /// alice's `device` sends `id` to `recipient`: the first hold's events on alice's shard,
    /// and the step it hands on (nil: refused, `refusal`).
    func send(
        _ id: String, to recipient: String, from device: DeviceRecord, _ shards: inout TwoShards
    ) -> (queued: Int, handOff: ShardStep?, refusal: RequestError?) {
        var effects: [SwitchboardEffect] = []
        let before = shards.states[0].counters.eventsQueued
        switch shards.states[0].send(TwoShards.message(id, to: recipient), from: device, now: TwoShards.at(2), into: &effects) {
        case .success(let acceptance):
            return (shards.states[0].counters.eventsQueued - before, acceptance.handOff, nil)
        case .failure(let refusal):
            return (shards.states[0].counters.eventsQueued - before, nil, refusal)
        }
    }

    /// Runs `steps` on alice's shard until the message goes on to `recipient`'s side
    /// (`deliverMessage`, returned with what is left); the events each hold queued there.
    func copyingHolds(_ steps: [ShardStep], _ shards: inout TwoShards) throws -> (perHold: [Int], rest: [ShardStep]) {
        var effects: [SwitchboardEffect] = []
        var pending = steps, perHold: [Int] = []
        while let step = pending.first {
            if case .deliverMessage = step { break }
            pending.removeFirst()
            let before = shards.states[0].counters.eventsQueued
            pending += shards.states[0].handle(step, now: TwoShards.at(2), into: &effects).next
            perHold.append(shards.states[0].counters.eventsQueued - before)
            try #require(perHold.count < 100, "the copies do not end")
        }
        return (perHold, pending)
    }

    @Test("a sender with 300 devices: its first hold queues 128 copies, its steps the rest 128 a hold, none writable before the recipient's shard decides; then every other device gets it once")
    func copiesInChunksAcrossShards() throws {
        var shards = TwoShards()
        let (senders, bobDevice) = try devices(&shards, recipient: bob)
        let sent = send("m1", to: bob, from: senders[0], &shards)
        #expect(sent.queued == Self.chunk)
        let handOff = try #require(sent.handOff)
        let copying = try copyingHolds([handOff], &shards)
        #expect(copying.perHold == [128, 43])
        #expect(bobDevice.queue.isEmpty, "the recipient's side comes after every copy")
        for device in senders.dropFirst() { #expect(writable(shards.states[0], device).isEmpty, "\(device.deviceID) may write an undecided copy") }

        let reply = shards.run(copying.rest, at: 2)
        #expect(TwoShards.isOK(reply))
        #expect(messages(bobDevice) == ["m1"])
        #expect(messages(senders[0]).isEmpty, "no copy to the sending device")
        for device in senders.dropFirst() {
            #expect(messages(device) == ["m1"], "\(device.deviceID)")
            #expect(writable(shards.states[0], device).count == 1, "\(device.deviceID)")
        }
        #expect(shards.states[0].activities[alice]?.copies.isEmpty ?? true)
        #expect(shards.states[0].activities[alice]?.recentMessageIDs["m1"] != nil, "the id is remembered")
    }

    @Test("the settle step wakes the copies a chunk per hold, each hold touching at most 128 devices")
    func settledInChunks() throws {
        var effects: [SwitchboardEffect] = []
        var shards = TwoShards()
        let (senders, _) = try devices(&shards, recipient: bob)
        for device in senders { device.wakePending = false }
        let handOff = try #require(send("m1", to: bob, from: senders[0], &shards).handOff)
        let copying = try copyingHolds([handOff], &shards)
        // bob's shard decides; alice's settles: one hold that wakes nobody, then chunks.
        var pending = shards.states[1].handle(copying.rest[0], now: TwoShards.at(2), into: &effects).next
        var wakesPerHold: [Int] = []
        while let step = pending.first {
            pending.removeFirst()
            var wakes: [SwitchboardEffect] = []
            pending += shards.states[0].handle(step, now: TwoShards.at(2), into: &wakes).next
            wakesPerHold.append(wakes.count)
            try #require(wakesPerHold.count < 100)
        }
        #expect(wakesPerHold == [0, 128, 128, 43])
    }

    @Test("a second message sent while the first's copies are still being queued waits behind them: every other device gets both in the order sent")
    func secondMessageWaits() throws {
        var effects: [SwitchboardEffect] = []
        var shards = TwoShards()
        let (senders, bobDevice) = try devices(&shards, recipient: bob)
        let first = try #require(send("m1", to: bob, from: senders[0], &shards).handOff)
        let second = send("m2", to: bob, from: senders[1], &shards)
        #expect(second.queued == 0, "m2's first hold queues nothing while m1's copies are being queued")
        // m2's step runs twice before m1's runs again: each of its holds queues m1's next
        // chunk, not its own, until m1's copies are all queued.
        var waiting = [try #require(second.handOff)]
        for _ in 0..<2 {
            let before = messages(senders[2])
            waiting = shards.states[0].handle(waiting[0], now: TwoShards.at(2), into: &effects).next
            #expect(waiting.count == 1 && !messages(senders[2]).contains("m2"), "\(before)")
        }
        var pending = [first] + waiting
        var replies: [Swift.Result<UInt64, RequestError>] = []
        var holds = 0
        while !pending.isEmpty {
            let step = pending.removeFirst()
            let outcome = shards.states[ShardMap.shard(of: step.user, count: 2)].handle(step, now: TwoShards.at(2), into: &effects)
            if let reply = outcome.reply { replies.append(reply) }
            pending += outcome.next
            holds += 1
            try #require(holds < 100)
        }
        #expect(replies.count == 2 && replies.allSatisfy { TwoShards.isOK($0) })
        #expect(messages(bobDevice) == ["m1", "m2"])
        #expect(messages(senders[0]) == ["m2"])
        #expect(messages(senders[1]) == ["m1"])
        for device in senders.dropFirst(2) { #expect(messages(device) == ["m1", "m2"], "\(device.deviceID)") }
    }

    @Test("a full sender device in a later chunk refuses the message: the chunks queued before are withdrawn (none ever written), nothing reaches the recipient, the id is free again")
    func fullDeviceInALaterChunk() throws {
        var effects: [SwitchboardEffect] = []
        var shards = TwoShards { $0.maxPendingEvents = 1 }
        let (senders, bobDevice) = try devices(&shards, recipient: bob)
        // d1 is among the oldest devices, so in the last chunk (the walk starts at the newest).
        let full = senders[1]
        _ = shards.states[0].enqueue(
            QueuedEvent(.messageDelivered(messageID: "x", recipient: "y", recipientDevice: "z", serverTime: 0), createdAt: 0), to: full, into: &effects)
        let pendingBefore = shards.states[0].counters.pendingEvents
        let sent = send("m1", to: bob, from: senders[0], &shards)
        let handOff = try #require(sent.handOff)
        let reply = shards.run([handOff], at: 2)
        #expect(TwoShards.code(reply) == .recipientBacklogFull)
        #expect(bobDevice.queue.isEmpty && bobDevice.lastSeq == 0, "the recipient's shard never saw it")
        #expect(shards.states[0].counters.pendingEvents == pendingBefore)
        for device in senders where device !== full {
            #expect(device.queue.isEmpty, "a copy left on \(device.deviceID)")
            #expect(writable(shards.states[0], device).isEmpty)
        }
        #expect(shards.states[0].activities[alice] == nil, "nothing of the message is left: the id is free")
        // Once d1 has room, the same id is a new message, accepted.
        _ = shards.states[0].ack(full, connection: full.connection!, through: full.lastSeq, into: &effects)
        let retry = try #require(send("m1", to: bob, from: senders[0], &shards).handOff)
        #expect(TwoShards.isOK(shards.run([retry], at: 3)))
        #expect(messages(bobDevice) == ["m1"])
        for device in senders.dropFirst() { #expect(messages(device) == ["m1"], "\(device.deviceID)") }
    }

    @Test("a full sender device in the first chunk refuses the message in its first hold, with nothing queued")
    func fullDeviceInTheFirstChunk() throws {
        var effects: [SwitchboardEffect] = []
        var shards = TwoShards { $0.maxPendingEvents = 1 }
        let (senders, _) = try devices(&shards, recipient: bob)
        let newest = try #require(senders.last)
        _ = shards.states[0].enqueue(
            QueuedEvent(.messageDelivered(messageID: "x", recipient: "y", recipientDevice: "z", serverTime: 0), createdAt: 0), to: newest, into: &effects)
        let sent = send("m1", to: bob, from: senders[0], &shards)
        #expect(sent.refusal?.code == .recipientBacklogFull && sent.handOff == nil && sent.queued == 0)
        #expect(shards.states[0].activities[alice] == nil)
    }

    @Test("a message the recipient's shard refuses: every copy is withdrawn a chunk per hold, never written, the id free again")
    func refusedByTheRecipientsShard() throws {
        var effects: [SwitchboardEffect] = []
        var shards = TwoShards { $0.maxPendingEvents = 1 }
        let (senders, bobDevice) = try devices(&shards, recipient: bob)
        _ = shards.states[1].enqueue(
            QueuedEvent(.messageDelivered(messageID: "x", recipient: "y", recipientDevice: "z", serverTime: 0), createdAt: 0), to: bobDevice, into: &effects)
        let pendingBefore = shards.states[0].counters.pendingEvents
        let handOff = try #require(send("m1", to: bob, from: senders[0], &shards).handOff)
        let copying = try copyingHolds([handOff], &shards)
        #expect(shards.states[0].counters.pendingEvents == pendingBefore + Self.senderDevices - 1)
        #expect(TwoShards.code(shards.run(copying.rest, at: 2)) == .recipientBacklogFull)
        #expect(shards.states[0].counters.pendingEvents == pendingBefore)
        for device in senders.dropFirst() {
            #expect(device.queue.isEmpty && device.lastSeq == 1, "\(device.deviceID): the copy's number is a hole")
        }
        #expect(shards.states[0].activities[alice] == nil)
    }

    @Test("a sender device forgotten while the copies are queued (the next one to get its copy), and one while they are woken: skipped, nothing counted twice")
    func deviceForgottenMidway() throws {
        var shards = TwoShards()
        let (senders, _) = try devices(&shards, recipient: bob)
        let pendingBefore = shards.states[0].counters.pendingEvents
        let handOff = try #require(send("m1", to: bob, from: senders[0], &shards).handOff)
        // The walk's next device (the newest 128 have their copy), and one already copied.
        let next = senders[Self.senderDevices - 1 - Self.chunk], copied = senders[Self.senderDevices - 1]
        shards.states[0].removeDevice(next)
        shards.states[0].removeDevice(copied)
        #expect(shards.states[0].counters.pendingEvents == pendingBefore + Self.chunk - 1, "the copied one's copy counted out with it")
        let copying = try copyingHolds([handOff], &shards)
        #expect(next.queue.isEmpty, "a forgotten device got a copy")
        #expect(TwoShards.isOK(shards.run(copying.rest, at: 2)))
        let others = senders.dropFirst().filter { $0 !== next && $0 !== copied }
        for device in others { #expect(messages(device) == ["m1"], "\(device.deviceID)") }
        #expect(shards.states[0].counters.pendingEvents == pendingBefore + others.count)
    }

    @Test("a message to a user of the sender's own shard: the copies in chunks first, then the recipient's side, every device once")
    func sameShard() throws {
        var shards = TwoShards()
        let (senders, carolDevice) = try devices(&shards, recipient: carol)
        let sent = send("m1", to: carol, from: senders[0], &shards)
        #expect(sent.queued == Self.chunk, "one chunk in the first hold, not every copy")
        let handOff = try #require(sent.handOff)
        let perHold = try shards.eventsPerHold([handOff], on: 0)
        #expect(perHold.allSatisfy { $0 <= Self.chunk })
        #expect(perHold.reduce(0, +) == Self.senderDevices - 1 - Self.chunk + 1, "the rest of the copies, and carol's")
        #expect(messages(carolDevice) == ["m1"])
        for device in senders.dropFirst() { #expect(messages(device) == ["m1"], "\(device.deviceID)") }
    }

    @Test("with a store, every hold of the copies is a unit of the message's commit group, none closing it: the OK waits for the commit of all of them")
    func journaledInTheMessagesGroup() throws {
        var effects: [SwitchboardEffect] = []
        var shards = TwoShards(journaling: true)
        let (senders, _) = try devices(&shards, recipient: bob)
        for index in 0..<2 { _ = shards.states[index].takeCommitUnit() }
        let (handOff, message) = try shards.sendDeferred("m1", to: bob, from: senders[0])
        let firstUnit = shards.states[0].takeCommitUnit()
        var units = [try #require(firstUnit)]
        // As `Switchboard.run` does: each step's hold is tied to the message first.
        var pending = [handOff]
        while !pending.isEmpty {
            let step = pending.removeFirst()
            let shard = ShardMap.shard(of: step.user, count: 2)
            shards.states[shard].deferReply(message, answers: false, queued: nil)
            let outcome = shards.states[shard].handle(step, now: TwoShards.at(2), into: &effects)
            if let queued = outcome.queued { shards.states[shard].recordPart(queued, of: message) }
            if shard == 0, let unit = shards.states[0].takeCommitUnit() { units.append(unit) }
            pending += outcome.next
        }
        let copying = units.filter { unit in unit.changes.contains { if case .appendEvent(alice, _, _) = $0 { true } else { false } } }
        #expect(copying.count == 3, "the copies went in three holds")
        for unit in units { #expect(unit.reply === message && unit.group === message && !unit.closesGroup) }
        let appended = copying.flatMap { unit in
            unit.changes.compactMap { change -> String? in if case .appendEvent(alice, let device, _) = change { device } else { nil } }
        }
        #expect(appended.count == Self.senderDevices - 1 && Set(appended).count == appended.count, "every copy once")
        #expect(message.takeParts().contains { $0.shard == 0 && $0.event.receipt?.messageID == "m1" })
    }
}

/// `Tools/routing-bench`'s table of holds (`HoldSurvey`) runs the synced copies in one hold
/// and in chunks: counted here, not timed.
@Suite("The hold survey's synced copies: one hold against a hold per chunk (counted, not timed)")
struct SyncedCopyHoldSurveyTests {
    func holds(_ figures: [HoldSurvey.Figure], _ prefix: String) -> Double? {
        figures.first { $0.operation.hasPrefix(prefix) }?.holdsPerOperation
    }

    @Test("300 other devices: queueing the copies takes 3 holds in chunks of 128 (1 in one hold), the settle step 4 (1)")
    func holdsPerOperation() {
        let chunked = HoldSurvey.syncedCopies(devices: 300, rounds: 2, chunk: SwitchboardState.fanOutChunk)
        #expect(holds(chunked, "synced copies: queueing them (chunks of 128)") == 3)
        #expect(holds(chunked, "synced copies: settle step (chunks of 128)") == 4)
        let whole = HoldSurvey.syncedCopies(devices: 300, rounds: 2, chunk: Int.max)
        #expect(holds(whole, "synced copies: queueing them (one hold)") == 1)
        #expect(holds(whole, "synced copies: settle step (one hold)") == 1)
    }
}
