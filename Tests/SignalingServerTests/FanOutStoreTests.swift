import SignalingProtocol
@testable import SignalingServer
import SignalingStore
import SignalingSupport
import TestSupport
import Testing

/// Fan-out in chunks with a store (docs/ARCHITECTURE.md, "Fan-out in chunks"): each chunk's
/// hold hands its changes in as a unit of the message's commit group, whichever message's
/// step runs it, so the writer commits every copy in one transaction with the sender's id
/// and the OK follows it.
@Suite("Fan-out in chunks with a store: every chunk's copies in the message's commit group (routing core, pure)")
struct FanOutCommitGroupTests {
    static let chunk = SwitchboardState.fanOutChunk
    let alice = TwoShards.user("alice", onShard: 0)
    let fan = TwoShards.user("fan", onShard: 0)
    let bob = TwoShards.user("bob", onShard: 1)

    /// The devices of `fan` a unit's changes append message `id` to.
    func copies(of id: String, in unit: CommitUnit) -> [String] {
        unit.changes.compactMap { change in
            guard case .appendEvent(fan, let device, let event) = change,
                String(decoding: event.body, as: UTF8.self).contains(id)
            else { return nil }
            return device
        }
    }

    @Test("with a store a fan-out takes several holds, each hold's unit a step of the message's group (the hold another message's step spends helping it too), every copy in exactly one of them")
    func chunksJoinTheMessagesGroup() throws {
        var effects: [SwitchboardEffect] = []
        var shards = TwoShards(journaling: true)
        let laptop = try shards.attach(alice, "laptop", slot: 1, at: 1)
        let bobDevice = try shards.attach(bob, "d1", slot: 2, at: 1)
        let devices = try (0..<(2 * Self.chunk + 10)).map { try shards.attach(fan, "d\($0)", slot: UInt32(100 + $0), at: 1) }
        for index in 0..<2 { _ = shards.states[index].takeCommitUnit() }

        // alice's m1 and bob's m2, both to fan: their first holds.
        var units: [CommitUnit] = []
        var steps: [(step: ShardStep, message: DeferredReply)] = []
        for (id, device, shard) in [("m1", laptop, 0), ("m2", bobDevice, 1)] {
            let (handOff, message) = try shards.sendDeferred(id, to: fan, from: device)
            if let unit = shards.states[shard].takeCommitUnit() { units.append(unit) }
            steps.append((handOff, message))
        }
        let m1 = steps[0].message, m2 = steps[1].message
        // As `Switchboard.run` does, m1's steps and m2's interleaved: m1's first hold starts
        // the fan-out, m2's first finds it in progress and helps.
        var holds = 0
        var replies: [String: Swift.Result<UInt64, RequestError>] = [:]
        while !steps.isEmpty {
            let (step, message) = steps.removeFirst()
            let shard = ShardMap.shard(of: step.user, count: 2)
            shards.states[shard].deferReply(message, answers: false, queued: nil)
            let outcome = shards.states[shard].handle(step, now: TwoShards.at(2), into: &effects)
            if let queued = outcome.queued { shards.states[shard].recordPart(queued, of: message) }
            if let unit = shards.states[shard].takeCommitUnit() { units.append(unit) }
            if let reply = outcome.reply { replies[message.messageID] = reply }
            steps += outcome.next.map { ($0, message) }
            holds += 1
        }
        #expect(TwoShards.isOK(replies["m1"]) && TwoShards.isOK(replies["m2"]))
        #expect(holds > 6, "the fan-outs went in chunks: \(holds) holds")

        let m1Units = units.filter { !copies(of: "m1", in: $0).isEmpty }
        #expect(m1Units.count >= 3, "m1's copies were queued in \(m1Units.count) holds")
        for unit in m1Units {
            #expect(unit.reply === m1 && unit.group === m1 && !unit.closesGroup, "a chunk of m1 outside its group")
            #expect(copies(of: "m2", in: unit).isEmpty, "one hold's unit holds both messages' copies")
        }
        for unit in units where !copies(of: "m2", in: unit).isEmpty { #expect(unit.reply === m2) }
        let m1Copies = m1Units.flatMap { copies(of: "m1", in: $0) }
        #expect(m1Copies.count == devices.count && Set(m1Copies).count == devices.count, "every copy once")
        #expect(units.flatMap { copies(of: "m2", in: $0) }.count == devices.count)
        // The id is in the group too, and the fan-out's event is the message's part on fan's
        // shard (what a refusal by the store cancels).
        #expect(units.contains { unit in
            unit.reply === m1 && unit.changes.contains { if case .rememberMessageID(let id) = $0 { id.messageID == "m1" } else { false } }
        })
        #expect(m1.takeParts().contains { $0.shard == 0 && $0.event.receipt?.messageID == "m1" && $0.event.receipt?.recipient == fan })
        // Closed, the group is committed whole; before, nothing from its first unit on.
        let firstOfM1 = try #require(units.firstIndex { $0.group === m1 })
        #expect(StoreWriter.committable(units) == firstOfM1)
        #expect(StoreWriter.committable(units + [CommitUnit(closing: m1), CommitUnit(closing: m2)]) == units.count + 2)
    }

    @Test("a fan-out decided by the hold of another message that helps it: its sender's settle step (the id remembered) is still a unit of its own message's group, handed on by its own step")
    func settleInItsOwnGroupWhenAHelperDecides() throws {
        var shards = TwoShards(journaling: true)
        let laptop = try shards.attach(alice, "laptop", slot: 1, at: 1)
        let bobDevice = try shards.attach(bob, "d1", slot: 2, at: 1)
        _ = try (0..<(2 * Self.chunk + 10)).map { try shards.attach(fan, "d\($0)", slot: UInt32(100 + $0), at: 1) }
        for index in 0..<2 { _ = shards.states[index].takeCommitUnit() }
        // m1 from bob, on the other shard (its settle step is a step of its own there);
        // m2 from alice, on fan's.
        let (m1Step, m1) = try shards.sendDeferred("m1", to: fan, from: bobDevice)
        let (m2Step, m2) = try shards.sendDeferred("m2", to: fan, from: laptop)
        var units: [CommitUnit] = []
        for index in 0..<2 { if let unit = shards.states[index].takeCommitUnit() { units.append(unit) } }
        /// Runs `step` in a hold tied to `message`, as `Switchboard.run` does; what it hands on.
        func hold(_ step: ShardStep, _ message: DeferredReply) -> [ShardStep] {
            var effects: [SwitchboardEffect] = []
            let shard = ShardMap.shard(of: step.user, count: 2)
            shards.states[shard].deferReply(message, answers: false, queued: nil)
            let outcome = shards.states[shard].handle(step, now: TwoShards.at(2), into: &effects)
            if let queued = outcome.queued { shards.states[shard].recordPart(queued, of: message) }
            if let unit = shards.states[shard].takeCommitUnit() { units.append(unit) }
            return outcome.next
        }
        // m1's first hold starts the fan-out; m2's step then helps it twice, the second
        // time with its last chunk, which decides m1.
        var m1Steps = hold(m1Step, m1)
        var m2Steps = hold(m2Step, m2)
        m2Steps = m2Steps.flatMap { hold($0, m2) }
        while !m2Steps.isEmpty { m2Steps = m2Steps.flatMap { hold($0, m2) } }
        while !m1Steps.isEmpty { m1Steps = m1Steps.flatMap { hold($0, m1) } }
        let remembering = units.filter { unit in
            unit.changes.contains { if case .rememberMessageID(let id) = $0 { id.messageID == "m1" } else { false } }
        }
        #expect(remembering.count == 1)
        #expect(remembering.allSatisfy { $0.reply === m1 && $0.group === m1 }, "m1's id was remembered in another message's group")
        #expect(shards.states[1].activities[bob]?.recentMessageIDs["m1"] != nil)
    }

    @Test("a fan-out refused by the store (its deadline) while its chunks are still being queued: no copy is ever written, and the sender's settle step does not remember the id, so a retry is a new message")
    func storeRefusalDuringTheChunks() throws {
        var effects: [SwitchboardEffect] = []
        var shards = TwoShards(journaling: true)
        let sender = try shards.attach(bob, "d1", slot: 1, at: 1)
        let devices = try (0..<(2 * Self.chunk + 10)).map { try shards.attach(fan, "d\($0)", slot: UInt32(100 + $0), at: 1) }
        let (handOff, m1) = try shards.sendDeferred("m1", to: fan, from: sender)
        var steps = [handOff]
        func runOne() {
            var effects: [SwitchboardEffect] = []
            let step = steps.removeFirst()
            let shard = ShardMap.shard(of: step.user, count: 2)
            shards.states[shard].deferReply(m1, answers: false, queued: nil)
            let outcome = shards.states[shard].handle(step, now: TwoShards.at(2), into: &effects)
            if let queued = outcome.queued { shards.states[shard].recordPart(queued, of: m1) }
            steps += outcome.next
        }
        runOne()  // the first chunk
        #expect(devices.filter { FanOutTests.messageIDs($0) == ["m1"] }.count == Self.chunk)
        // The store's deadline passes: `Switchboard.cancel`, one hold per shard.
        #expect(m1.settle(.refused))
        let parts = m1.takeParts()
        for shard in [0, 1] {
            let events = parts.filter { $0.shard == shard }.map(\.event)
            shards.states[shard].cancelMessage(events, sender: bob, messageID: "m1")
        }
        while !steps.isEmpty { runOne() }
        for device in devices { #expect(FanOutTests.writable(shards.states[0], device).isEmpty, "a refused copy is writable") }
        #expect(shards.states[1].activities[bob]?.recentMessageIDs["m1"] == nil, "the refused message's id is remembered")
        guard case .success(let retry) = shards.states[1].send(TwoShards.message("m1", to: fan), from: sender, now: TwoShards.at(3), into: &effects) else {
            Issue.record("the retry was refused"); return
        }
        #expect(retry.handOff != nil, "the retry was taken for a duplicate")
        #expect(shards.states[0].counters.messagesAccepted == 0 && shards.states[0].counters.messagesCancelled == 1)
    }
}

/// The same over real sockets, with the store a test controls (`ModelEventStore`).
@Suite("Fan-out in chunks with a store over real sockets: one commit, the OK after it, a refusal undoes every chunk, a restart loses nothing")
struct FanOutStoreTests {
    static let deviceCount = SwitchboardState.fanOutChunk + 20
    /// fan and alice on different shards of two.
    let fan = TwoShards.user("fan", onShard: 0)
    let alice = TwoShards.user("alice", onShard: 1)

    func isMessage(_ id: String) -> (StoreChange) -> Bool {
        { change in
            switch change {
            case .appendEvent(_, _, let event), .holdForUser(_, let event): String(decoding: event.body, as: UTF8.self).contains(id)
            case .rememberMessageID(let remembered): remembered.messageID == id
            default: false
            }
        }
    }

    func connectFan(_ server: TestServer, _ store: ModelEventStore) throws -> [TestClient] {
        let devices = try (0..<Self.deviceCount).map { try server.connect(user: fan, device: "d\($0)").0 }
        try server.waitFor("the devices to be stored") { _ in (try? store.loadSnapshot().devices.count) == Self.deviceCount }
        return devices
    }

    func message(_ id: String) -> Request { Request.identifiedMessage(id, to: fan) }

    @Test("a message to more devices than a chunk, with a store: every copy and the id in one commit, the OK only after it, then every device gets it once")
    func okAfterOneCommitOfEveryChunk() throws {
        let store = ModelEventStore()
        let server = try TestServer(store: store) { $0.storeTimeout = .seconds(30) }
        let devices = try connectFan(server, store)
        let (laptop, _) = try server.connect(user: alice, device: "laptop")
        try server.waitFor("the sender to be stored") { _ in (try? store.loadSnapshot().devices.count) == Self.deviceCount + 1 }

        store.closeGate()
        defer { store.openGate() }
        try laptop.send(.request(id: 1, message("m1")))
        try server.waitFor("the commit to reach the store") { _ in store.appliesWaitingAtGate == 1 }
        let commit = store.lastAttempt
        let copied = commit.compactMap { change -> String? in
            guard case .appendEvent(fan, let device, _) = change, isMessage("m1")(change) else { return nil }
            return device
        }
        #expect(copied.count == Self.deviceCount && Set(copied).count == Self.deviceCount, "\(copied.count) copies in the commit")
        #expect(commit.contains { if case .rememberMessageID(let id) = $0 { id.messageID == "m1" } else { false } }, "the id")
        #expect(try laptop.staysSilent(for: .milliseconds(50)), "OK before the commit")

        store.openGate()
        #expect(try laptop.reply(to: 1).isOK)
        for device in devices {
            guard case .message(let delivered) = try device.nextEvent().event else { Issue.record("not delivered"); return }
            #expect(delivered.messageID == "m1")
        }
    }

    @Test("a message from a sender with more other devices than a chunk, with a store: every synced copy, the recipient's event and the id in one commit, the OK only after it; then every device gets it once")
    func syncedCopiesInOneCommit() throws {
        let store = ModelEventStore()
        let server = try TestServer(store: store) { $0.storeTimeout = .seconds(30) }
        let senders = try (0..<Self.deviceCount).map { try server.connect(user: alice, device: "d\($0)").0 }
        let (recipient, _) = try server.connect(user: fan, device: "phone")
        try server.waitFor("the devices to be stored") { _ in (try? store.loadSnapshot().devices.count) == Self.deviceCount + 1 }

        store.closeGate()
        defer { store.openGate() }
        try senders[0].send(.request(id: 1, message("m1")))
        try server.waitFor("the commit to reach the store") { _ in store.appliesWaitingAtGate == 1 }
        let commit = store.lastAttempt
        let copied = commit.compactMap { change -> String? in
            guard case .appendEvent(alice, let device, _) = change, isMessage("m1")(change) else { return nil }
            return device
        }
        #expect(copied.count == Self.deviceCount - 1 && Set(copied).count == copied.count, "\(copied.count) synced copies in the commit")
        #expect(commit.contains { change in if case .appendEvent(fan, _, _) = change { isMessage("m1")(change) } else { false } }, "the recipient's event")
        #expect(commit.contains { if case .rememberMessageID(let id) = $0 { id.messageID == "m1" } else { false } }, "the id")
        #expect(try senders[0].staysSilent(for: .milliseconds(50)), "OK before the commit")

        store.openGate()
        #expect(try senders[0].reply(to: 1).isOK)
        for device in [recipient] + senders.dropFirst() {
            guard case .message(let delivered) = try device.nextEvent().event else { Issue.record("not delivered"); return }
            #expect(delivered.messageID == "m1")
        }
    }

    @Test("a fan-out in chunks whose commit fails is refused at the store timeout and undone in every chunk: nothing stored or delivered, the id free, the retry delivered once")
    func storeFailureWithdrawsEveryChunk() throws {
        let store = ModelEventStore()
        let server = try TestServer(store: store) {
            $0.storeTimeout = .seconds(5)
            $0.delivery = .afterCommit
        }
        let devices = try connectFan(server, store)
        let (laptop, _) = try server.connect(user: alice, device: "laptop")
        try server.waitFor("the sender to be stored") { _ in (try? store.loadSnapshot().devices.count) == Self.deviceCount + 1 }
        store.failCommits(with: StoreError(.full, "database or disk is full"))

        try laptop.send(.request(id: 1, message("m1")))
        try server.waitFor("a failed commit") { _ in store.failedAttempts > 0 }
        server.clock.advance(by: .seconds(6))
        #expect(try laptop.reply(to: 1).errorCode == .storeUnavailable)
        // A device of the first chunk, one of the last.
        #expect(try devices[0].staysSilent(for: .milliseconds(30)), "delivered to a device of the first chunk")
        #expect(try devices[Self.deviceCount - 1].staysSilent(for: .milliseconds(30)), "delivered to a device of the last chunk")

        store.failCommits(with: nil)
        try server.waitFor("the store to recover", timeout: .seconds(10)) { _ in store.committedBatches > 0 }
        #expect(!store.appliedChanges.contains(where: isMessage("m1")), "part of a refused fan-out was committed")
        #expect(try laptop.requestUntilAccepted(firstID: 2, message("m1")))
        for device in devices {
            guard case .message(let delivered) = try device.nextEvent().event else { Issue.record("the retry was not delivered"); return }
            #expect(delivered.messageID == "m1")
        }
        #expect(try devices[0].staysSilent(for: .milliseconds(30)), "the refused copy was delivered after all")
        #expect(try devices[Self.deviceCount - 1].staysSilent(for: .milliseconds(30)), "the refused copy was delivered after all")
    }

    @Test("after OKs for fan-outs in chunks, a restart loses nothing and repeats nothing: every device gets every message once, in order; a re-send is de-duplicated")
    func restartAfterOK() throws {
        let store = ModelEventStore()
        let clock = ManualClock()
        var serverTimes: [String: UInt64] = [:]
        do {
            let server = try TestServer(store: store, clock: clock)
            // fan's devices are known, and offline.
            do { _ = try connectFan(server, store) }
            let (laptop, _) = try server.connect(user: alice, device: "laptop")
            for index in 1...3 {
                guard case .ok(_, let time) = try laptop.request(UInt32(index), message("m\(index)")) else {
                    Issue.record("m\(index) refused"); return
                }
                serverTimes["m\(index)"] = time
            }
        }
        let server = try TestServer(store: store, clock: clock)
        let devices = try (0..<Self.deviceCount).map { try server.connect(user: fan, device: "d\($0)").0 }
        for device in devices { #expect(try device.nextMessageIDs(3) == ["m1", "m2", "m3"]) }
        let (laptop, _) = try server.connect(user: alice, device: "laptop")
        guard case .ok(_, let time) = try laptop.request(9, message("m2")) else { Issue.record("re-send refused"); return }
        #expect(time == serverTimes["m2"])
        #expect(try devices[0].staysSilent(for: .milliseconds(50)))
    }
}
