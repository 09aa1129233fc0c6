import SignalingProtocol
import SignalingStore
import SignalingSupport
import TestSupport
import Testing
@testable import SignalingServer

/// An ACK that covers more events than one hold takes out (`SwitchboardState.ackChunk`),
/// driven one hold (one step) at a time, as `Switchboard.run` takes them, so each test can
/// look at the device between two chunks and slip other ACKs, handshakes and removals in.
@Suite("ACKs in chunks: bounded holds, everything through the ACK acknowledged at once, receipts exactly once (routing core, pure)")
struct AcknowledgementTests {
    static let chunk = SwitchboardState.ackChunk
    /// alice sends; bob (the other shard) receives and acknowledges.
    let alice = TwoShards.user("alice", onShard: 0)
    let bob = TwoShards.user("bob", onShard: 1)
    /// carol shares bob's shard: her receipts are delivered in the acknowledging hold.
    let carol = TwoShards.user("carol", onShard: 1)

    /// `sender` sends messages `prefix`1...`count` to bob, each decided at once.
    func send(_ shards: inout TwoShards, _ count: Int, from sender: DeviceRecord, prefix: String = "m") {
        var effects: [SwitchboardEffect] = []
        for number in 1...count {
            let message = OutgoingMessage(
                messageID: "\(prefix)\(number)", recipient: bob, contentType: "text/plain", body: Array("\(prefix)\(number)".utf8))
            let reply = shards.request(sender.userID, at: 2) { state in
                switch state.send(message, from: sender, now: TwoShards.at(2), into: &effects) {
                case .success(let acceptance):
                    return .answered(.success(acceptance.serverTime), next: acceptance.handOff.map { [$0] } ?? [])
                case .failure(let refusal): return .answered(.failure(refusal))
                }
            }
            #expect(TwoShards.isOK(reply), "\(prefix)\(number) refused")
        }
    }

    /// The message ids of the MESSAGE_DELIVERED events waiting for `device`, in order.
    static func receipts(_ device: DeviceRecord) -> [String] {
        TwoShards.events(device).compactMap { event in
            guard case .messageDelivered(let id, _, _, _) = event else { return nil }
            return id
        }
    }

    /// The seq of the message `id` in `device`'s queue.
    static func seq(of id: String, in device: DeviceRecord) -> UInt64? {
        var found: UInt64?
        device.queue.forEach(after: 0) { seq, event in
            if String(decoding: event.encoded.body, as: UTF8.self).contains("\"\(id)\"") || event.receipt?.messageID == id {
                found = seq
                return false
            }
            return true
        }
        return found
    }

    /// What `device`'s pump would write now to its connection, from `after`.
    static func writable(_ state: SwitchboardState, _ device: DeviceRecord, after: UInt64) -> [UInt64] {
        var written: [UInt64] = []
        _ = state.nextBatch(for: device, connection: device.connection!, after: after, limit: 100_000) { seq, _ in
            written.append(seq)
            return true
        }
        return written
    }

    /// Runs the steps of `pending` one hold at a time (first in, first out); returns how
    /// many holds of bob's shard took events out, checking each took at most a chunk.
    func runChain(_ shards: inout TwoShards, _ pending: inout [ShardStep], device: DeviceRecord) -> Int {
        var effects: [SwitchboardEffect] = []
        var chunks = 0
        while !pending.isEmpty {
            let step = pending.removeFirst()
            let before = device.queue.count
            let outcome = shards.states[ShardMap.shard(of: step.user, count: 2)].handle(step, now: TwoShards.at(3), into: &effects)
            if case .continueAcknowledgement = step {
                #expect(before - device.queue.count <= Self.chunk, "one hold took \(before - device.queue.count) events out")
                chunks += 1
            }
            pending += outcome.next
        }
        return chunks
    }

    @Test("a device's acknowledgement in progress is found with none, one and several in progress, and no other device's is")
    func acknowledgementsInProgressByDevice() {
        let devices = (0..<3).map { DeviceRecord(userID: "u\($0)", deviceID: "d", sessionID: SessionID(high: 0, low: UInt64($0))) }
        var inProgress = Acknowledgements()
        #expect(inProgress.of(devices[0]) == nil)
        let first = inProgress.start(devices[0], through: 10)
        #expect(inProgress.of(devices[0]) === first)
        #expect(inProgress.of(devices[1]) == nil)
        let second = inProgress.start(devices[1], through: 20)
        #expect(inProgress.of(devices[0]) === first && inProgress.of(devices[1]) === second)
        #expect(inProgress.of(devices[2]) == nil)
        inProgress.remove(first)
        #expect(inProgress.of(devices[0]) == nil && inProgress.of(devices[1]) === second)
        inProgress.remove(second)
        #expect(inProgress.of(devices[1]) == nil && inProgress.isEmpty)
    }

    @Test("an ACK of more events than a chunk takes them out a chunk per hold, the rest in holds of their own, and every receipt goes to the sender on the other shard exactly once, in order")
    func chunkedAcrossShards() throws {
        var effects: [SwitchboardEffect] = []
        var shards = TwoShards()
        let laptop = try shards.attach(alice, "laptop", slot: 1, at: 1)
        let phone = try shards.attach(bob, "phone", slot: 2, at: 1)
        let count = 3 * Self.chunk + 5
        send(&shards, count, from: laptop)
        #expect(phone.queue.count == count)

        var pending = shards.states[1].ack(phone, connection: phone.connection!, through: phone.lastSeq, into: &effects).next
        #expect(phone.queue.count == count - Self.chunk, "the ACK's own hold took out \(count - phone.queue.count) events")
        #expect(pending.filter { if case .continueAcknowledgement = $0 { true } else { false } }.count == 1)
        #expect(pending.last.map { if case .continueAcknowledgement = $0 { true } else { false } } == true, "the chain goes after the chunk's receipts")
        let chunks = runChain(&shards, &pending, device: phone)
        #expect(chunks == 3, "three more chunks, each in a hold of its own")
        #expect(phone.queue.isEmpty && phone.ackedSeq == phone.lastSeq)
        #expect(Self.receipts(laptop) == (1...count).map { "m\($0)" }, "every receipt once, in order")
        #expect(shards.states[1].acknowledgements.isEmpty, "nothing left behind")
        #expect(shards.states[1].counters.pendingEvents == 0)
    }

    @Test("receipts for a sender on the acknowledging device's own shard are delivered in the hold that takes each event out, exactly once, and each copy counts against the hold's chunk: a sender with three devices gets a quarter chunk of receipts a hold")
    func chunkedWithinOneShard() throws {
        var effects: [SwitchboardEffect] = []
        var shards = TwoShards()
        let tablet = try shards.attach(carol, "tablet", slot: 1, at: 1)
        let others = try (0..<2).map { try shards.attach(carol, "d\($0)", slot: UInt32(10 + $0), at: 1) }
        let phone = try shards.attach(bob, "phone", slot: 2, at: 1)
        let count = Self.chunk + 1
        send(&shards, count, from: tablet)
        for device in others { _ = shards.states[1].ack(device, connection: device.connection!, through: device.lastSeq, into: &effects) }
        // Each event costs one, and its receipt one per sender device: 4.
        let perHold = Self.chunk / 4
        var pending = shards.states[1].ack(phone, connection: phone.connection!, through: phone.lastSeq, into: &effects).next
        #expect(Self.receipts(tablet).count == perHold, "the first hold's receipts")
        #expect(phone.queue.count == count - perHold)
        while !pending.isEmpty {
            let step = pending.removeFirst()
            let before = (phone.queue.count, Self.receipts(tablet).count)
            pending += shards.states[1].handle(step, now: TwoShards.at(3), into: &effects).next
            #expect(before.0 - phone.queue.count <= perHold, "one hold took \(before.0 - phone.queue.count) events out")
            #expect(Self.receipts(tablet).count - before.1 == before.0 - phone.queue.count, "a receipt per event, in the same hold")
        }
        for device in [tablet] + others { #expect(Self.receipts(device) == (1...count).map { "m\($0)" }) }
    }

    @Test("while an ACK is taken out in chunks, everything through it counts as acknowledged: a duplicate or lower ACK does nothing, the pump writes only what came after, and each receipt still goes out once")
    func duplicateAndLowerMeanwhile() throws {
        var effects: [SwitchboardEffect] = []
        var shards = TwoShards()
        let laptop = try shards.attach(alice, "laptop", slot: 1, at: 1)
        let phone = try shards.attach(bob, "phone", slot: 2, at: 1)
        let count = 3 * Self.chunk
        send(&shards, count, from: laptop)
        let through = phone.lastSeq
        send(&shards, 2, from: laptop, prefix: "late")
        var pending = shards.states[1].ack(phone, connection: phone.connection!, through: through, into: &effects).next
        #expect(shards.states[1].acknowledgedSeq(of: phone) == through)
        #expect(phone.ackedSeq < through, "the rest is still queued")

        let duplicate = shards.states[1].ack(phone, connection: phone.connection!, through: through, into: &effects)
        let lower = shards.states[1].ack(phone, connection: phone.connection!, through: through - 1, into: &effects)
        #expect(duplicate.violation == nil && duplicate.next.isEmpty && lower.violation == nil && lower.next.isEmpty)
        #expect(phone.queue.count == count - Self.chunk + 2, "a duplicate or lower ACK took events out")
        // The pump, even from the oldest queued number, writes only the two late messages.
        #expect(Self.writable(shards.states[1], phone, after: 0) == [through + 1, through + 2])

        _ = runChain(&shards, &pending, device: phone)
        #expect(Self.receipts(laptop) == (1...count).map { "m\($0)" })
        #expect(phone.queue.count == 2 && phone.ackedSeq == through)
        #expect(shards.states[1].acknowledgements.isEmpty)
    }

    @Test("a higher ACK while one is in progress takes a chunk in its own hold and extends the one in progress, whose chain goes on to it; receipts once")
    func higherMeanwhile() throws {
        var effects: [SwitchboardEffect] = []
        var shards = TwoShards()
        let laptop = try shards.attach(alice, "laptop", slot: 1, at: 1)
        let phone = try shards.attach(bob, "phone", slot: 2, at: 1)
        send(&shards, 4 * Self.chunk, from: laptop)
        let first = try #require(Self.seq(of: "m\(2 * Self.chunk)", in: phone))
        var pending = shards.states[1].ack(phone, connection: phone.connection!, through: first, into: &effects).next
        let higher = try #require(Self.seq(of: "m\(4 * Self.chunk - 3)", in: phone))
        let more = shards.states[1].ack(phone, connection: phone.connection!, through: higher, into: &effects).next
        #expect(!more.contains { if case .continueAcknowledgement = $0 { true } else { false } }, "a second chain for one device")
        #expect(phone.queue.count == 2 * Self.chunk, "each ACK's hold took a chunk")
        pending += more
        _ = runChain(&shards, &pending, device: phone)
        #expect(phone.queue.count == 3 && phone.ackedSeq == higher)
        #expect(Self.receipts(laptop) == (1...(4 * Self.chunk - 3)).map { "m\($0)" })
        #expect(shards.states[1].acknowledgements.isEmpty)
    }

    @Test("a disconnect and a new session while an ACK is in progress: the ACK stands, WELCOME's ackedSeq is all of it, nothing it covers is sent again, and a resume point beyond it extends it")
    func reconnectMeanwhile() throws {
        var effects: [SwitchboardEffect] = []
        var shards = TwoShards()
        let laptop = try shards.attach(alice, "laptop", slot: 1, at: 1)
        let phone = try shards.attach(bob, "phone", slot: 2, at: 1)
        send(&shards, 3 * Self.chunk, from: laptop)
        let through = try #require(Self.seq(of: "m\(2 * Self.chunk + 10)", in: phone))
        var pending = shards.states[1].ack(phone, connection: phone.connection!, through: through, into: &effects).next
        shards.states[1].detach(phone, connection: TwoShards.connection(2), now: TwoShards.at(3))

        // A new session (no resume point): sent from after the whole ACK.
        let fresh = try shards.states[1].attach(
            userID: bob, deviceID: "phone", resume: nil, connection: TwoShards.connection(3), now: TwoShards.at(4), into: &effects).get()
        #expect(fresh.ackedSeq == through && fresh.sentSeq == through)
        #expect(Self.writable(shards.states[1], phone, after: fresh.sentSeq).first == through + 1)

        // A takeover resuming further: its resume point acknowledges more, in the same chain.
        let resumePoint = through + 20
        let resumed = try shards.states[1].attach(
            userID: bob, deviceID: "phone", resume: ResumePoint(sessionID: fresh.sessionID, lastReceivedSeq: resumePoint),
            connection: TwoShards.connection(4), now: TwoShards.at(5), into: &effects).get()
        #expect(resumed.ackedSeq == resumePoint && resumed.sentSeq == resumePoint)
        #expect(!resumed.next.contains { if case .continueAcknowledgement = $0 { true } else { false } })
        pending += resumed.next
        _ = runChain(&shards, &pending, device: phone)
        #expect(phone.ackedSeq == resumePoint && phone.queue.count == 3 * Self.chunk - Int(resumePoint))
        #expect(Self.receipts(laptop) == (1...Int(resumePoint)).map { "m\($0)" })
    }

    @Test("a device forgotten while its ACK is in progress ends it: the next step does nothing, and no event is counted out twice")
    func forgottenMeanwhile() throws {
        var effects: [SwitchboardEffect] = []
        var shards = TwoShards()
        let laptop = try shards.attach(alice, "laptop", slot: 1, at: 1)
        let phone = try shards.attach(bob, "phone", slot: 2, at: 1)
        send(&shards, 3 * Self.chunk, from: laptop)
        var pending = shards.states[1].ack(phone, connection: phone.connection!, through: phone.lastSeq, into: &effects).next
        let (forgotten, _) = shards.states[1].forgetUser(bob, now: TwoShards.at(3), into: &effects)
        #expect((try? forgotten.get()) == 1)
        #expect(shards.states[1].acknowledgements.isEmpty)
        _ = runChain(&shards, &pending, device: phone)
        #expect(shards.states[1].counters.pendingEvents == 0)
        #expect(Self.receipts(laptop).count == Self.chunk, "receipts of events taken out after the device was forgotten")
    }

    @Test("with a store, the hold that receives an ACK in chunks journals all of it, and it starts a commit group that the chain's units join")
    func journaledWhole() throws {
        var effects: [SwitchboardEffect] = []
        var shards = TwoShards(journaling: true)
        let laptop = try shards.attach(alice, "laptop", slot: 1, at: 1)
        let phone = try shards.attach(bob, "phone", slot: 2, at: 1)
        send(&shards, 2 * Self.chunk + 1, from: laptop)
        for index in 0..<2 { _ = shards.states[index].takeCommitUnit() }
        let through = phone.lastSeq
        var pending = shards.states[1].ack(phone, connection: phone.connection!, through: through, into: &effects).next
        let started = shards.states[1].group(for: pending)
        let group = try #require(started, "no group for the chain")
        let taken = shards.states[1].takeCommitUnit()
        let unit = try #require(taken)
        #expect(unit.changes.contains(.acknowledge(user: bob, device: "phone", through: through)))
        #expect(unit.group === group && !unit.closesGroup)
        // As `Switchboard.run` does: every later hold's unit joins the group, and none
        // journals the acknowledgement again.
        var receiptsJournaled = 0
        while !pending.isEmpty {
            let step = pending.removeFirst()
            let shard = ShardMap.shard(of: step.user, count: 2)
            let outcome = shards.states[shard].handle(step, now: TwoShards.at(3), into: &effects)
            shards.states[shard].join(group)
            if let unit = shards.states[shard].takeCommitUnit() {
                #expect(unit.group === group && !unit.closesGroup)
                #expect(!unit.changes.contains { if case .acknowledge = $0 { true } else { false } })
                // Receipts cross in one step per sender and chunk (`ShardStep.receipts`):
                // counted by the MESSAGE_DELIVERED events the units journal, not by units.
                receiptsJournaled += unit.changes.count { if case .appendEvent(let user, _, _) = $0 { user == alice } else { false } }
            }
            pending += outcome.next
        }
        #expect(receiptsJournaled == 2 * Self.chunk + 1, "every receipt in a unit of the group on the sender's shard")
        #expect(phone.queue.isEmpty)
    }
}

/// The same over real sockets, with the store a test controls (`ModelEventStore`).
@Suite("ACKs in chunks with a store over real sockets: the acknowledgement and its receipts in one commit, a restart re-sends nothing acknowledged and loses nothing")
struct AcknowledgementStoreTests {
    static let count = 3 * SwitchboardState.ackChunk + 10
    /// bob acknowledges; alice, on the other shard of two, sent.
    let bob = TwoShards.user("bob", onShard: 0)
    let alice = TwoShards.user("alice", onShard: 1)

    @Test("an ACK of more events than a chunk with a store: the acknowledgement and every receipt it made in one commit; after a restart WELCOME's ackedSeq is all of it, only the unacknowledged events come again, and the sender has every receipt once")
    func restartAfterLargeAck() throws {
        let store = ModelEventStore()
        let clock = ManualClock()
        let count = Self.count
        var through: UInt64 = 0
        do {
            let server = try TestServer(store: store, clock: clock)
            let (phone, _) = try server.connect(user: bob, device: "phone")
            let (laptop, _) = try server.connect(user: alice, device: "laptop")
            for number in 1...(count + 2) {
                guard try laptop.request(UInt32(number), .identifiedMessage("m\(number)", to: bob)).isOK else {
                    Issue.record("m\(number) refused"); return
                }
            }
            var seqs: [UInt64] = []
            for _ in 0..<(count + 2) { seqs.append(try phone.nextEvent().seq) }
            through = seqs[count - 1]

            store.closeGate()
            defer { store.openGate() }
            try phone.ack(through)
            try server.waitFor("the acknowledgement's commit to reach the store") { _ in store.appliesWaitingAtGate == 1 }
            let commit = store.lastAttempt
            try #require(commit.contains(.acknowledge(user: bob, device: "phone", through: through)), "another commit at the gate")
            let receipts = commit.filter { if case .appendEvent(alice, "laptop", _) = $0 { true } else { false } }
            #expect(receipts.count == count, "\(receipts.count) of \(count) receipts committed with the acknowledgement")
            store.openGate()
            try server.waitFor("the commit") { _ in store.events(user: bob, device: "phone").count == 2 }
        }
        let server = try TestServer(store: store, clock: clock)
        let (phone, welcome) = try server.connect(user: bob, device: "phone")
        #expect(welcome.ackedSeq == through)
        #expect(try phone.nextMessageIDs(2) == ["m\(count + 1)", "m\(count + 2)"])
        #expect(try phone.staysSilent(for: .milliseconds(50)), "an acknowledged event came again")
        let (laptop, _) = try server.connect(user: alice, device: "laptop")
        var delivered: [String] = []
        // Those of the large ACK, then those of the two the phone acknowledged just now.
        for _ in 0..<(count + 2) {
            guard case .messageDelivered(let id, _, _, _) = try laptop.nextEvent().event else { Issue.record("not a receipt"); return }
            delivered.append(id)
        }
        #expect(delivered == (1...(count + 2)).map { "m\($0)" })
        #expect(try laptop.staysSilent(for: .milliseconds(50)), "a receipt came twice")
    }
}
