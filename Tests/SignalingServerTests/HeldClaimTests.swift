import SignalingProtocol
@testable import SignalingServer
import SignalingStore
import SignalingSupport
import TestSupport
import Testing

/// A first device claiming the messages held for its user, a chunk per hold (`HeldClaim`).
/// bob (shard 1) has no device while alice (shard 0) sends him `count` messages; then his
/// first device connects.
struct HeldClaimBench {
    static let chunk = SwitchboardState.fanOutChunk
    let alice = TwoShards.user("alice", onShard: 0)
    let bob = TwoShards.user("bob", onShard: 1)
    var shards: TwoShards
    let laptop: DeviceRecord
    /// The commit units of every hold so far, in order (with a store).
    var units: [CommitUnit] = []

    init(held count: Int, journaling: Bool = false) throws {
        shards = TwoShards(journaling: journaling)
        laptop = try shards.attach(alice, "laptop", slot: 1, at: 1)
        takeUnits()
        for index in 0..<count { try send("m\(index)") }
    }

    mutating func takeUnits() {
        for index in 0..<2 { if let unit = shards.states[index].takeCommitUnit() { units.append(unit) } }
    }

    /// alice sends message `id` to bob; its steps run to the end (not the claim's).
    mutating func send(_ id: String) throws {
        var effects: [SwitchboardEffect] = []
        let acceptance = try #require(try? shards.states[0].send(TwoShards.message(id, to: bob), from: laptop, now: TwoShards.at(2), into: &effects).get())
        takeUnits()
        try run([#require(acceptance.handOff)])
    }

    /// Runs `steps` and those they hand on, one hold each (a claim's steps included).
    mutating func run(_ steps: [ShardStep]) throws {
        var effects: [SwitchboardEffect] = []
        var pending = steps
        while !pending.isEmpty {
            let step = pending.removeFirst()
            pending += shards.states[ShardMap.shard(of: step.user, count: 2)].handle(step, now: TwoShards.at(2), into: &effects).next
            takeUnits()
        }
    }

    /// bob's device `device` connects (a new session, or `resume`); returns it and the
    /// step for the rest of its claim.
    mutating func connect(_ device: String, slot: UInt32, resume: ResumePoint? = nil) throws -> (DeviceRecord, ShardStep?) {
        var effects: [SwitchboardEffect] = []
        let grant = try shards.states[1].attach(
            userID: bob, deviceID: device, resume: resume, connection: TwoShards.connection(slot), now: TwoShards.at(3), into: &effects
        ).get()
        takeUnits()
        return (grant.record, grant.claim)
    }

    /// Runs one step of a claim (one hold); returns the events it queued and its next step.
    mutating func claimStep(_ step: ShardStep) -> (queued: Int, next: ShardStep?) {
        var effects: [SwitchboardEffect] = []
        let before = shards.states[1].counters.eventsQueued
        let next = shards.states[1].handle(step, now: TwoShards.at(3), into: &effects).next
        takeUnits()
        #expect(next.count <= 1)
        return (shards.states[1].counters.eventsQueued - before, next.first)
    }

    static func ids(_ range: Range<Int>) -> [String] { range.map { "m\($0)" } }
}

@Suite("A first device claims held messages a chunk per hold (routing core, pure)")
struct HeldClaimTests {
    @Test("1,000 held messages: the handshake and ceil(1000/128) - 1 steps, one hold each, at most 128 enqueues a hold, in the order they were held")
    func claimsInChunks() throws {
        var bench = try HeldClaimBench(held: 1_000)
        let before = bench.shards.states[1].counters.eventsQueued
        var (device, step) = try bench.connect("phone", slot: 2)
        var perHold = [bench.shards.states[1].counters.eventsQueued - before]
        while let next = step {
            let (queued, after) = bench.claimStep(next)
            perHold.append(queued)
            step = after
            try #require(perHold.count <= 100, "the claim never ends")
        }
        #expect(perHold.count == (1_000 + HeldClaimBench.chunk - 1) / HeldClaimBench.chunk, "holds: \(perHold)")
        #expect(perHold.allSatisfy { $0 <= HeldClaimBench.chunk }, "holds: \(perHold)")
        #expect(perHold.reduce(0, +) == 1_000)
        #expect(FanOutTests.messageIDs(device) == HeldClaimBench.ids(0..<1_000))
        #expect(bench.shards.states[1].activities[bench.bob] == nil, "the user's activity outlived the claim")
        #expect(bench.shards.states[1].counters.pendingEvents == 1_000)
        device = bench.shards.states[1].device(bench.bob, "phone")!
        #expect(device.queue.count == 1_000)
    }

    @Test("a message arriving while the claim is unfinished waits for it, helping it along, and comes after every held one")
    func messageMidClaimComesAfter() throws {
        var effects: [SwitchboardEffect] = []
        var bench = try HeldClaimBench(held: 1_000)
        let (device, step) = try bench.connect("phone", slot: 2)
        #expect(FanOutTests.messageIDs(device).count == HeldClaimBench.chunk)
        // "late" from alice, and "note" from bob's own device, before the claim's next step.
        let acceptance = try #require(try? bench.shards.states[0].send(TwoShards.message("late", to: bench.bob), from: bench.laptop, now: TwoShards.at(3), into: &effects).get())
        let note = try #require(try? bench.shards.states[1].send(TwoShards.message("note", to: bench.bob), from: device, now: TwoShards.at(3), into: &effects).get())
        #expect(note.handOff != nil, "a message to the claiming user was queued at once")
        try bench.run([#require(acceptance.handOff), #require(note.handOff), #require(step)])
        // The note to oneself skips its sending device, as it does without a claim.
        #expect(FanOutTests.messageIDs(device) == HeldClaimBench.ids(0..<1_000) + ["late"])
        #expect(bench.shards.states[1].activities[bench.bob]?.claim == nil)
    }

    @Test("a device that disconnects mid-claim still gets every held message, in order, when it resumes")
    func disconnectMidClaim() throws {
        var bench = try HeldClaimBench(held: 500)
        var (device, step) = try bench.connect("phone", slot: 2)
        bench.shards.states[1].detach(device, connection: TwoShards.connection(2), now: TwoShards.at(3))
        while let next = step { step = bench.claimStep(next).next }
        let (resumed, more) = try bench.connect("phone", slot: 3, resume: ResumePoint(sessionID: device.sessionID, lastReceivedSeq: 0))
        #expect(more == nil && resumed === device)
        device = resumed
        #expect(FanOutTests.messageIDs(device) == HeldClaimBench.ids(0..<500))
        #expect(FanOutTests.writable(bench.shards.states[1], device) == HeldClaimBench.ids(0..<500))
    }

    @Test("a second device connecting mid-claim starts no claim of its own and gets none of the held messages; a message after the claim reaches both, after the held ones on the first")
    func secondDeviceMidClaim() throws {
        var bench = try HeldClaimBench(held: 500)
        var (first, step) = try bench.connect("phone", slot: 2)
        let (second, secondClaim) = try bench.connect("tablet", slot: 3)
        #expect(secondClaim == nil, "a second claim")
        #expect(FanOutTests.messageIDs(second).isEmpty)
        try bench.send("after")  // waits for the claim: helps it to the end
        while let next = step { step = bench.claimStep(next).next }
        first = bench.shards.states[1].device(bench.bob, "phone")!
        #expect(FanOutTests.messageIDs(first) == HeldClaimBench.ids(0..<500) + ["after"])
        #expect(FanOutTests.messageIDs(second) == ["after"])
    }

    @Test("the claiming device forgotten mid-claim: the user's other device claims the rest, in order")
    func claimingDeviceForgotten() throws {
        var bench = try HeldClaimBench(held: 500)
        let (first, step) = try bench.connect("phone", slot: 2)
        let (second, _) = try bench.connect("tablet", slot: 3)
        bench.shards.states[1].removeDevice(first)
        var next = step
        while let current = next { next = bench.claimStep(current).next }
        #expect(FanOutTests.messageIDs(second) == HeldClaimBench.ids(HeldClaimBench.chunk..<500))
    }

    @Test("a held message refused by the store mid-claim is skipped, the others claimed in order")
    func cancelledMidClaim() throws {
        var bench = try HeldClaimBench(held: 300)
        let (device, step) = try bench.connect("phone", slot: 2)
        let held = try #require(bench.shards.states[1].activities[bench.bob]?.held)
        let refused = try #require(held.first { $0.receipt?.messageID == "m200" })
        bench.shards.states[1].cancelMessage([refused], sender: bench.alice, messageID: "m200")
        var next = step
        while let current = next { next = bench.claimStep(current).next }
        #expect(FanOutTests.writable(bench.shards.states[1], device) == HeldClaimBench.ids(0..<300).filter { $0 != "m200" })
    }
}

/// With a store each chunk is a commit unit of its own (`HeldClaim`): the store never has
/// an event both held and in the device's queue, or in neither.
@Suite("A claim of held messages with a store: chunk by chunk, a restart mid-claim loses and repeats nothing (routing core, pure)")
struct HeldClaimStoreTests {
    @Test("each chunk's unit copies its events and releases the held ones through its last ordinal, nothing beyond, on its own")
    func unitPerChunk() throws {
        var bench = try HeldClaimBench(held: 300, journaling: true)
        bench.units = []
        var (_, step) = try bench.connect("phone", slot: 2)
        while let next = step { step = bench.claimStep(next).next }
        var released: [UInt64] = []
        var claimedPerUnit: [Int] = []
        for unit in bench.units {
            let claimed = unit.changes.filter { if case .claimHeldEvent = $0 { true } else { false } }.count
            guard claimed > 0 else { continue }
            claimedPerUnit.append(claimed)
            #expect(unit.group == nil && unit.reply == nil, "a chunk in a group")
            for change in unit.changes { if case .releaseHeld(_, let through) = change { released.append(through) } }
        }
        #expect(claimedPerUnit == [128, 128, 44])
        #expect(released == [128, 256, 300])
    }

    @Test("a restart after some chunks were committed and some claimed messages acknowledged: the device gets the rest once, in order, nothing acknowledged again")
    func restartMidClaim() throws {
        var effects: [SwitchboardEffect] = []
        let store = ModelEventStore()
        var bench = try HeldClaimBench(held: 1_000, journaling: true)
        func commit(_ bench: inout HeldClaimBench) throws {
            for unit in bench.units { try store.apply(unit.changes) }
            bench.units = []
        }
        try commit(&bench)
        #expect(try store.loadSnapshot().held[bench.bob]?.count == 1_000)
        var (device, step) = try bench.connect("phone", slot: 2)
        step = bench.claimStep(try #require(step)).next  // two chunks
        // The device acknowledges the first 200 (its receipts are not this test's).
        let ack = bench.shards.states[1].ack(device, connection: TwoShards.connection(2), through: 200, into: &effects)
        #expect(ack.violation == nil)
        bench.takeUnits()
        try bench.run(ack.next)
        try commit(&bench)
        // One more chunk that never reaches the store: the crash.
        step = bench.claimStep(try #require(step)).next
        bench.units = []
        let snapshot = try store.loadSnapshot()
        #expect(snapshot.held[bench.bob]?.count == 1_000 - 2 * HeldClaimBench.chunk)
        let stored = snapshot.devices.first { $0.userID == bench.bob }?.events.compactMap { TwoShards.decode($0) } ?? []
        #expect(stored.count == 2 * HeldClaimBench.chunk - 200)

        var restarted = HeldClaimBench.restarted(from: snapshot)
        let session = device.sessionID
        let grant = try restarted.attach(
            userID: bench.bob, deviceID: "phone", resume: ResumePoint(sessionID: session, lastReceivedSeq: 200),
            connection: TwoShards.connection(9), now: TwoShards.at(10), into: &effects
        ).get()
        device = grant.record
        var next = grant.claim
        while let current = next { next = restarted.handle(current, now: TwoShards.at(10), into: &effects).next.first }
        #expect(FanOutTests.messageIDs(device) == HeldClaimBench.ids(200..<1_000), "lost or repeated after the restart")
    }
}

extension HeldClaimBench {
    /// bob's shard of a restarted server, from `snapshot`.
    static func restarted(from snapshot: StoredSnapshot) -> SwitchboardState {
        var state = SwitchboardState(
            configuration: SwitchboardConfiguration(), epoch: TwoShards.epoch, journaling: true, shard: ShardMap(count: 2, index: 1))
        state.load(snapshot, now: TwoShards.at(10))
        return state
    }
}

extension TwoShards {
    /// A stored event as a device would read it (nil: not an event).
    static func decode(_ stored: StoredEvent) -> Event? {
        guard let type = FrameType(rawValue: stored.type) else { return nil }
        return decode(QueuedEvent(encoded: EncodedEvent(type: type, body: stored.body), receipt: nil, createdAt: 0))
    }
}

@Suite("Held messages over the embedded loops: 1,000 reach the first device in order, a later message after them")
struct EmbeddedHeldClaimTests {
    @Test("1,000 messages held for bob reach his first device once each, in order, by the claim's own steps, and the next message after them")
    func thousandHeld() throws {
        let server = try EmbeddedServer()
        let (alice, _) = try server.connect(user: "alice")
        for index in 0..<1_000 {
            #expect(try alice.request(UInt32(index + 1), .identifiedMessage("m\(index)", to: "bob")).isOK)
        }
        let (bob, _) = try server.connect(user: "bob")
        // Every chunk by the claim's own steps (no message helps it along here).
        #expect(try bob.nextMessageIDs(1_000) == HeldClaimBench.ids(0..<1_000))
        #expect(try alice.request(5_000, .identifiedMessage("late", to: "bob")).isOK)
        #expect(try bob.nextMessageIDs(1) == ["late"])
        #expect(bob.staysSilent)
    }
}

/// The server's path (the handshake's hold, then the claim's steps with a chain of their
/// own) over real sockets, with the store a test controls (`ModelEventStore`).
@Suite("Held messages claimed in chunks with a store over real sockets")
struct HeldClaimStoreEndToEndTests {
    @Test("300 messages held with a store reach the first device in order; once acknowledged and committed, a restart holds and sends none of them again")
    func claimedCommittedAndNotRepeated() throws {
        let store = ModelEventStore()
        let clock = ManualClock()
        do {
            let server = try TestServer(store: store, clock: clock)
            let (alice, _) = try server.connect(user: "alice")
            for index in 0..<300 {
                #expect(try alice.request(UInt32(index + 1), .identifiedMessage("m\(index)", to: "bob")).isOK)
            }
            #expect(try store.loadSnapshot().held["bob"]?.count == 300)
            let (bob, _) = try server.connect(user: "bob")
            // Every chunk by the claim's own steps (no message helps it along here).
            #expect(try bob.nextMessageIDs(300) == HeldClaimBench.ids(0..<300))
            #expect(try alice.request(1_000, .identifiedMessage("late", to: "bob")).isOK)
            #expect(try bob.nextMessageIDs(1) == ["late"])
            try server.waitFor("the claim and the acknowledgements to be committed") { _ in
                (try? store.loadSnapshot()).map { $0.held["bob"] == nil } == true && store.events(user: "bob", device: "d1").isEmpty
            }
        }
        let server = try TestServer(store: store, clock: clock)
        let (bob, _) = try server.connect(user: "bob")
        #expect(try bob.staysSilent(for: .milliseconds(100)), "a claimed and acknowledged message again after the restart")
    }
}
