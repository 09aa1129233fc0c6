import Foundation
import SignalingProtocol
@testable import SignalingServer
import SignalingStore
import SignalingSupport
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// Routing shards with a durable store (docs/ARCHITECTURE.md, "Routing shards"): a message
/// from alice (shard 1 of 2) to bob (shard 0) is a step on each shard, each hold's
/// changes a commit unit of its own, and every guarantee of one shard holds: the OK only
/// once every change of the message is committed, a refusal undoes it on both shards, a
/// restart loses and repeats nothing. alice has a second device (`phone`), so the sender's
/// shard has a copy to commit too.
@Suite("Routing shards with a store: a message across shards is committed whole")
struct ShardedStoreTests {
    init() {
        // The users these tests rely on being on different shards of two.
        precondition(ShardMap.shard(of: "alice", count: 2) != ShardMap.shard(of: "bob", count: 2))
    }

    /// A commit unit of `group` (a message's, if it is a `DeferredReply`), its last or not.
    func unit(_ group: CommitGroup?, closes: Bool = true, shard: Int = 0) -> CommitUnit {
        var unit = CommitUnit()
        unit.group = group
        unit.reply = group as? DeferredReply
        unit.closesGroup = closes
        unit.shard = shard
        unit.add(.acknowledge(user: "someone", device: "d1", through: 1))
        return unit
    }

    @Test("a commit unit has room for the changes its operation journals and no more: a registration's two, an acknowledgement's two (with a receipt in its shard), a message's few")
    func unitRoomFitsItsChanges() throws {
        var effects: [SwitchboardEffect] = []
        let a = ShardMap.shard(of: "alice", count: 2), b = ShardMap.shard(of: "bob", count: 2)
        var shards = TwoShards(journaling: true)
        // The thousands of registrations of a handshake ramp may wait in the writer's queue
        // together: each unit's array is 272 bytes with room for two, 512 with four.
        let laptop = try shards.attach("alice", "laptop", slot: 1, at: 1)
        let registration = shards.states[a].takeCommitUnit()
        #expect(registration?.changes.count == 2 && registration?.changes.capacity == 2, "\(String(describing: registration?.changes))")
        let phone = try shards.attach("bob", "phone", slot: 2, at: 1)
        _ = shards.states[b].takeCommitUnit()

        let (handOff, _) = try shards.sendDeferred("m1", to: "alice", from: phone)
        _ = shards.states[a].handle(handOff, now: TwoShards.at(2), into: &effects)
        let delivery = shards.states[a].takeCommitUnit()
        #expect((delivery?.changes.count ?? 0) >= 1 && delivery?.changes.capacity == 4, "the recipient's hold: \(String(describing: delivery?.changes))")

        #expect(laptop.lastSeq > laptop.ackedSeq)
        _ = shards.states[a].ack(laptop, connection: laptop.connection!, through: laptop.lastSeq, into: &effects)
        let ack = shards.states[a].takeCommitUnit()
        #expect(ack?.changes.count == 1 && ack?.changes.capacity == 2, "the acknowledgement: \(String(describing: ack?.changes))")
    }

    @Test("the writer commits a message's units from several shards only together with its answering unit, never some of them alone; an ACK's with its receipts' alike")
    func committableWaitsForTheAnswer() {
        let m1 = TwoShards.deferredReply("m1", sender: "alice"), m2 = TwoShards.deferredReply("m2", sender: "alice"), ack = CommitGroup()
        // Units of other operations, m1's steps on shards 1 and 0, m2's whole (one shard).
        var pending = [unit(nil), unit(m1, closes: false, shard: 1), unit(m2), unit(m1, closes: false, shard: 0), unit(nil)]
        #expect(StoreWriter.committable(pending) == 1, "m1's first step went alone")
        pending.append(CommitUnit(closing: m1))
        #expect(pending.last?.answers == true)
        #expect(StoreWriter.committable(pending) == pending.count)
        #expect(StoreWriter.committable([unit(nil), unit(m2)]) == 2)
        // An ACK on shard 0 and the receipt it sent to shard 1.
        pending += [unit(ack, closes: false, shard: 0), unit(ack, closes: false, shard: 1)]
        #expect(StoreWriter.committable(pending) == pending.count - 2, "the ACK went without its receipt")
        pending.append(CommitUnit(closing: ack))
        #expect(pending.last?.answers == false)
        #expect(StoreWriter.committable(pending) == pending.count)
    }

    /// A unit of `group` with `changes` (nothing else), its last or not.
    func unit(_ group: CommitGroup?, closes: Bool = false, shard: Int, _ changes: [StoreChange]) -> CommitUnit {
        var unit = CommitUnit()
        unit.group = group
        unit.reply = group as? DeferredReply
        unit.closesGroup = closes
        unit.shard = shard
        for change in changes { unit.add(change) }
        return unit
    }

    func append(_ user: String, _ device: String, seq: UInt64) -> StoreChange {
        .appendEvent(user: user, device: device, event: StoredEvent(seq: seq, type: 0x40, body: [], createdAt: 0))
    }

    @Test("a closed group whose steps interleave with an open one's is committed whole: its later units are pulled forward past independent units, or the commit stops before its first unit")
    func straddlingGroupsStayWhole() {
        let a = TwoShards.deferredReply("a", sender: "alice"), b = TwoShards.deferredReply("b", sender: "alice")
        // a's copy to alice's phone, then b's (b still open), then a's event for bob, a's id, and a's closing unit.
        var pending = [
            unit(a, shard: 1, [append("alice", "phone", seq: 1)]),
            unit(b, shard: 1, [append("alice", "phone", seq: 2)]),
            unit(a, shard: 0, [append("bob", "d1", seq: 1)]),
            unit(a, shard: 1, [.rememberMessageID(StoredMessageID(sender: "alice", messageID: "a", serverTime: 1, expiresAt: 2))]),
            CommitUnit(closing: a),
        ]
        #expect(StoreWriter.commitOrder(pending) == [0, 2, 3, 4], "a was split, or waited for b")
        // A later unit of a that must stay after b's (alice's phone acknowledged b's copy):
        // a waits whole.
        pending.insert(unit(a, shard: 1, [.acknowledge(user: "alice", device: "phone", through: 2)]), at: 4)
        #expect(StoreWriter.commitOrder(pending) == [])
        pending.append(CommitUnit(closing: b))
        #expect(StoreWriter.commitOrder(pending) == Array(pending.indices))
    }

    @Test("a closed group held back by an open one commits once the groups opened before its last unit have closed: groups opened after it, however many and however they overlap each other, do not hold it back")
    func heldBackGroupWaitsForOlderGroupsOnly() {
        let a = TwoShards.deferredReply("a", sender: "alice"), b = TwoShards.deferredReply("b", sender: "alice")
        // a's unit, b's first unit (b open), a's acknowledgement that must stay after b's
        // event (it cannot be pulled past it), a closed.
        var pending = [
            unit(a, shard: 1, [append("alice", "phone", seq: 1)]),
            unit(b, shard: 1, [append("alice", "phone", seq: 2)]),
            unit(a, shard: 1, [.acknowledge(user: "alice", device: "phone", through: 2)]),
            CommitUnit(closing: a),
        ]
        #expect(StoreWriter.commitOrder(pending) == [], "a must wait for b")
        let aAndB = pending.count + 2  // with b's last unit and b's closing unit
        // Newer groups keep opening, each touching the same device and each still open
        // when the next starts, while b finishes.
        var seq: UInt64 = 3
        for round in 0..<50 {
            let newer = TwoShards.deferredReply("n\(round)", sender: "alice")
            pending.append(unit(newer, shard: 1, [append("alice", "phone", seq: seq)]))
            seq += 1
            if round == 0 {
                pending.insert(unit(b, shard: 0, [append("bob", "d1", seq: 1)]), at: 4)
                pending.insert(CommitUnit(closing: b), at: 5)
            }
        }
        // Every newer group started after a's and b's last units: a and b commit whole,
        // the commit stops at the first newer group's first unit.
        #expect(StoreWriter.commitOrder(pending) == Array(0..<aAndB))
    }

    /// alice's laptop and phone and bob's device, connected and stored; a first message
    /// delivered, its copy and its receipts read, everything acknowledged and the
    /// acknowledgements committed, so that nothing else is on its way to the store (or to
    /// a device) when a test begins.
    func connectStored(_ server: TestServer, _ store: ModelEventStore) throws -> (laptop: TestClient, phone: TestClient, bob: TestClient) {
        let (laptop, _) = try server.connect(user: "alice", device: "laptop")
        let (phone, _) = try server.connect(user: "alice", device: "phone")
        let (bob, _) = try server.connect(user: "bob")
        try server.waitFor("the devices to be stored") { _ in (try? store.loadSnapshot().devices.count) == 3 }
        #expect(try laptop.request(900, Request.identifiedMessage("warm-up", to: "bob")).isOK)
        let bobSeq = try bob.nextEvent().seq
        _ = try phone.nextEvent()  // the copy
        try bob.ack(bobSeq)
        let laptopSeq = try laptop.nextEvent().seq, phoneSeq = try phone.nextEvent().seq  // the receipts
        try laptop.ack(laptopSeq)
        try phone.ack(phoneSeq)
        // The applied changes, not the snapshot: a device's reserved numbers count as
        // acknowledged there anyway (StoredDevice.ackedSeq).
        try server.waitFor("the acknowledgements to be committed") { _ in
            let applied = store.appliedChanges
            func acknowledged(_ user: String, _ device: String, _ seq: UInt64) -> Bool {
                applied.contains { if case .acknowledge(user, device, let through) = $0 { through >= seq } else { false } }
            }
            return acknowledged("bob", "d1", bobSeq) && acknowledged("alice", "laptop", laptopSeq) && acknowledged("alice", "phone", phoneSeq)
        }
        return (laptop, phone, bob)
    }

    func isMessage(_ id: String) -> (StoreChange) -> Bool {
        { change in
            switch change {
            case .appendEvent(_, _, let event), .holdForUser(_, let event): String(decoding: event.body, as: UTF8.self).contains(id)
            case .rememberMessageID(let remembered): remembered.messageID == id
            default: false
            }
        }
    }

    func stored(_ id: String, in snapshot: StoredSnapshot) -> [String] {
        var places: [String] = []
        for device in snapshot.devices {
            for event in device.events where String(decoding: event.body, as: UTF8.self).contains(id) {
                places.append("\(device.userID)/\(device.deviceID)")
            }
        }
        if snapshot.messageIDs.contains(where: { $0.messageID == id }) { places.append("message id") }
        return places
    }

    @Test("a message the store refuses between the sender's hold and the recipient's (its deadline passed meanwhile): the recipient's event is cancelled in the hold that queues it, never written")
    func refusedBetweenTheSteps() throws {
        var effects: [SwitchboardEffect] = []
        var shards = TwoShards(journaling: true)
        let sender = TwoShards.user("sender", onShard: 1), recipient = TwoShards.user("recipient", onShard: 0)
        let from = try shards.attach(sender, "d1", slot: 1, at: 1)
        let to = try shards.attach(recipient, "d1", slot: 2, at: 1)
        let (handOff, m1) = try shards.sendDeferred("m1", to: recipient, from: from)
        // The writer refuses it (`Switchboard.cancel`: settle, then one hold per shard of
        // its parts) before the recipient's step has run: nothing of it there to cancel yet.
        #expect(m1.settle(.refused))
        for part in m1.takeParts() { shards.states[part.shard].cancelMessage([part.event], sender: sender, messageID: "m1") }
        shards.states[1].cancelMessage([], sender: sender, messageID: "m1")
        // Then the recipient's step, as `Switchboard.run` runs it.
        shards.states[0].deferReply(m1, answers: false, queued: nil)
        let outcome = shards.states[0].handle(handOff, now: TwoShards.at(2), into: &effects)
        let queued = try #require(outcome.queued, "the recipient's shard queued nothing")
        shards.states[0].recordPart(queued, of: m1)
        #expect(queued.isCancelled)
        #expect(FanOutTests.writable(shards.states[0], to).isEmpty, "a message the sender was told is refused would be written")
    }

    @Test("a message to another shard's user: its OK comes after one commit that holds both shards' changes (the recipient's event, the sender's copy, the id)")
    func okAfterBothShardsCommitted() throws {
        let store = ModelEventStore()
        let server = try TestServer(store: store) { $0.storeTimeout = .seconds(30) }
        #expect(server.server.routingShards == 2, "a store keeps one shard per loop")
        let (laptop, phone, bob) = try connectStored(server, store)

        store.closeGate()
        defer { store.openGate() }
        try laptop.send(.request(id: 1, Request.identifiedMessage("m1", to: "bob")))
        try server.waitFor("the commit to reach the store") { _ in store.appliesWaitingAtGate == 1 }
        let commit = store.lastAttempt
        #expect(commit.contains { if case .appendEvent("bob", "d1", _) = $0 { isMessage("m1")($0) } else { false } }, "bob's event")
        #expect(commit.contains { if case .appendEvent("alice", "phone", _) = $0 { isMessage("m1")($0) } else { false } }, "the phone's copy")
        #expect(commit.contains { if case .rememberMessageID(let id) = $0 { id.messageID == "m1" } else { false } }, "the id")
        #expect(try laptop.staysSilent(for: .milliseconds(50)), "OK before the commit")

        store.openGate()
        #expect(try laptop.reply(to: 1).isOK)
        #expect(stored("m1", in: try store.loadSnapshot()).sorted() == ["alice/phone", "bob/d1", "message id"])
        guard case .message(let delivered) = try bob.nextEvent().event, case .message(let copy) = try phone.nextEvent().event else {
            Issue.record("not delivered")
            return
        }
        #expect(delivered.messageID == "m1" && copy.messageID == "m1")
    }

    @Test("an acknowledgement and the receipts it sends to the sender's devices on another shard are committed in one transaction")
    func ackCommittedWithItsReceipts() throws {
        let store = ModelEventStore()
        let server = try TestServer(store: store) { $0.storeTimeout = .seconds(30) }
        let (laptop, phone, bob) = try connectStored(server, store)
        #expect(try laptop.request(1, Request.identifiedMessage("m1", to: "bob")).isOK)
        let seq = try bob.nextEvent().seq
        _ = try phone.nextEvent()  // the copy, not acknowledged: nothing else goes to the store
        try server.waitFor("the message's release") { _ in store.events(user: "bob", device: "d1").map(\.seq) == [seq] }

        store.closeGate()
        defer { store.openGate() }
        try bob.ack(seq)
        try server.waitFor("the commit to reach the store") { _ in store.appliesWaitingAtGate == 1 }
        let commit = store.lastAttempt
        #expect(commit.contains { if case .acknowledge("bob", "d1", seq) = $0 { true } else { false } })
        let receipts = commit.compactMap { change -> String? in
            guard case .appendEvent("alice", let device, let event) = change, event.type == FrameType.messageDelivered.rawValue else { return nil }
            return device
        }
        #expect(receipts.sorted() == ["laptop", "phone"], "\(commit)")
        store.openGate()
        guard case .messageDelivered = try laptop.nextEvent().event else { Issue.record("no receipt"); return }
    }

    @Test("a message to another shard's user whose commit fails is refused at the store timeout and undone on both shards: nothing stored or delivered, the id free again")
    func commitFailureUndoesBothShards() throws {
        let store = ModelEventStore()
        let server = try TestServer(store: store) {
            $0.storeTimeout = .seconds(5)
            $0.delivery = .afterCommit
        }
        let (laptop, phone, bob) = try connectStored(server, store)
        store.failCommits(with: StoreError(.full, "database or disk is full"))

        try laptop.send(.request(id: 1, Request.identifiedMessage("m1", to: "bob")))
        try server.waitFor("a failed commit") { _ in store.failedAttempts > 0 }
        server.clock.advance(by: .seconds(6))
        #expect(try laptop.reply(to: 1).errorCode == .storeUnavailable)
        #expect(try bob.staysSilent(for: .milliseconds(30)), "delivered to the recipient's shard's device")
        #expect(try phone.staysSilent(for: .milliseconds(30)), "copied to the sender's other device")

        store.failCommits(with: nil)
        try server.waitFor("the store to recover", timeout: .seconds(10)) { _ in store.committedBatches > 0 }
        #expect(!store.appliedChanges.contains(where: isMessage("m1")), "part of a refused message was committed")
        // The id is free on the sender's shard: the retry is a new message, delivered once
        // to bob and copied once to the phone.
        #expect(try laptop.requestUntilAccepted(firstID: 2, Request.identifiedMessage("m1", to: "bob")))
        guard case .message(let delivered) = try bob.nextEvent().event, case .message(let copy) = try phone.nextEvent().event else {
            Issue.record("the retry was not delivered")
            return
        }
        #expect(delivered.messageID == "m1" && copy.messageID == "m1")
        #expect(try bob.staysSilent(for: .milliseconds(30)), "the refused copy was delivered after all")
        #expect(try phone.staysSilent(for: .milliseconds(30)), "the refused copy was delivered after all")
        #expect(stored("m1", in: try store.loadSnapshot()).sorted() == ["alice/phone", "bob/d1", "message id"])
    }

    @Test("a message to another shard's user refused while its commit hung: when the commit lands, both shards' changes are withdrawn, also across a restart")
    func hungCommitWithdrawnOnBothShards() throws {
        let store = ModelEventStore()
        let clock = ManualClock()
        do {
            let server = try TestServer(store: store, clock: clock) {
                $0.storeTimeout = .seconds(5)
                $0.delivery = .afterCommit
            }
            // Connected throughout (a disconnect would be a commit of its own).
            let (laptop, phone, bob) = try connectStored(server, store)
            defer { withExtendedLifetime((phone, bob)) {} }
            store.closeGate()
            defer { store.openGate() }
            try laptop.send(.request(id: 1, Request.identifiedMessage("m1", to: "bob")))
            try server.waitFor("the commit to hang") { _ in store.appliesWaitingAtGate == 1 }
            #expect(store.lastAttempt.contains(where: isMessage("m1")))
            try server.advance(by: .milliseconds(5_200))
            #expect(try laptop.reply(to: 1).errorCode == .storeUnavailable)

            store.openGate()
            try server.waitFor("the refused message to be withdrawn") { _ in
                store.appliedChanges.contains { if case .forgetMessageID("alice", "m1", _) = $0 { true } else { false } }
            }
            let withdrawn = store.appliedChanges.compactMap { change -> String? in
                if case .withdrawEvent(let user, let device, _) = change { "\(user)/\(device)" } else { nil }
            }
            #expect(Set(withdrawn) == ["bob/d1", "alice/phone"])
            #expect(stored("m1", in: try store.loadSnapshot()).isEmpty)
        }
        // Restarted: nothing of m1 comes back on either shard, and its id is free.
        let server = try TestServer(store: store, clock: clock)
        let (bob, _) = try server.connect(user: "bob")
        let (phone, _) = try server.connect(user: "alice", device: "phone")
        #expect(try bob.staysSilent(for: .milliseconds(50)), "a refused message delivered after a restart")
        #expect(try phone.staysSilent(for: .milliseconds(50)), "a refused copy delivered after a restart")
        let (laptop, _) = try server.connect(user: "alice", device: "laptop")
        #expect(try laptop.request(2, Request.identifiedMessage("m1", to: "bob")).isOK)
        guard case .message(let retried) = try bob.nextEvent().event else { Issue.record("not delivered"); return }
        #expect(retried.messageID == "m1")
    }

    @Test("after OKs for messages to another shard's user, a restart loses nothing and repeats nothing: every message and copy once, a re-send de-duplicated")
    func restartAfterOK() throws {
        let store = ModelEventStore()
        let clock = ManualClock()
        var serverTimes: [String: UInt64] = [:]
        do {
            let server = try TestServer(store: store, clock: clock)
            // bob's device and alice's phone are known, and offline.
            do { _ = try server.connect(user: "bob") }
            do { _ = try server.connect(user: "alice", device: "phone") }
            let (laptop, _) = try server.connect(user: "alice", device: "laptop")
            for index in 1...5 {
                guard case .ok(_, let time) = try laptop.request(UInt32(index), Request.identifiedMessage("m\(index)", to: "bob")) else {
                    Issue.record("m\(index) refused")
                    return
                }
                serverTimes["m\(index)"] = time
            }
        }
        let server = try TestServer(store: store, clock: clock)
        func messages(_ client: TestClient) throws -> [String] {
            var ids: [String] = []
            while let next = try? client.nextEvent(timeout: .milliseconds(200)) {
                if case .message(let message) = next.event { ids.append(message.messageID) }
                try client.ack(next.seq)
            }
            return ids
        }
        let (bob, _) = try server.connect(user: "bob")
        let (phone, _) = try server.connect(user: "alice", device: "phone")
        #expect(try messages(bob) == ["m1", "m2", "m3", "m4", "m5"])
        #expect(try messages(phone) == ["m1", "m2", "m3", "m4", "m5"])
        // The ids survived on the sender's shard: a re-send is answered with the first OK's
        // time and delivered to nobody.
        let (laptop, _) = try server.connect(user: "alice", device: "laptop")
        guard case .ok(_, let time) = try laptop.request(9, Request.identifiedMessage("m3", to: "bob")) else {
            Issue.record("re-send refused")
            return
        }
        #expect(time == serverTimes["m3"])
        #expect(try bob.staysSilent(for: .milliseconds(50)))
        #expect(try phone.staysSilent(for: .milliseconds(50)))
    }
}

/// The default configuration as a user runs it: `voipserver` with its SQLite store.
@Suite("Routing shards with the SQLite store (voipserver subprocess)", .serialized)
struct ShardedSQLiteStoreTests {
    @Test("voipserver --workers 2 with its SQLite store splits the routing state into 2 shards and routes messages across them, also after a restart")
    func twoShardsWithSQLite() throws {
        let data = try TemporaryDirectory("voipserver-sharded-store")
        var session: SessionID?
        do {
            let server = try ServerProcess(["--data-dir", data.path, "--workers", "2", "--admin-listen", "127.0.0.1:0"])
            let adminPort = try #require(ServiceDeploymentTests.adminPort(in: server.log))
            let metrics = try HTTPRequest.send("GET", port: adminPort, "/metrics")
            #expect(String(decoding: metrics.body, as: UTF8.self).contains("\nvoipserver_routing_shards 2\n"))
            let bob = try TestClient(port: server.port)
            session = try bob.hello(user: "bob").sessionID
            let alice = try TestClient(port: server.port)
            try alice.hello(user: "alice")
            #expect(try alice.request(1, Request.identifiedMessage("m1", to: "bob")).isOK)
            guard case .message(let delivered) = try bob.nextEvent().event else { Issue.record("not delivered"); return }
            #expect(delivered.messageID == "m1")
            #expect(try alice.request(2, Request.identifiedMessage("m2", to: "bob")).isOK)  // not acknowledged
            #expect(server.terminate() == 0)
        }
        let server = try ServerProcess(["--data-dir", data.path, "--workers", "2"])
        let bob = try TestClient(port: server.port)
        let welcome = try bob.hello(user: "bob", resume: ResumePoint(sessionID: try #require(session), lastReceivedSeq: 1))
        #expect(welcome.resumed)
        guard case .message(let kept) = try bob.nextEvent().event else { Issue.record("lost after the restart"); return }
        #expect(kept.messageID == "m2")
        let alice = try TestClient(port: server.port)
        try alice.hello(user: "alice")
        #expect(try alice.request(3, Request.identifiedMessage("m2", to: "bob")).isOK)
        #expect(try bob.staysSilent(for: .milliseconds(50)), "a re-sent message delivered twice")
    }
}

/// Steps on their shards' owner loops (each step posted to the loop that owns its user's
/// shard), in the default configuration: many messages across shards in both directions,
/// pipelined, from connections the kernel spread over both loops.
@Suite("Steps on owner loops with the SQLite store (voipserver subprocess)", .serialized)
struct OwnerLoopSQLiteTests {
    @Test("voipserver --workers 2 with SQLite: many pipelined messages across shards, each OK only after its commit: a kill -9 loses none of them and repeats none")
    func manyMessagesAcrossShardsSurviveACrash() throws {
        let data = try TemporaryDirectory("voipserver-owner-loops")
        func user(_ prefix: String, onShard shard: Int) -> String {
            (0...).lazy.map { "\(prefix)\($0)" }.first { ShardMap.shard(of: $0, count: 2) == shard }!
        }
        // Two senders per shard, each writing to a recipient of the other shard.
        let pairs = (0..<4).map { index in
            (sender: user("sender\(index)-", onShard: index % 2), recipient: user("recipient\(index)-", onShard: 1 - index % 2))
        }
        let perSender = 500
        var accepted: [String: Set<String>] = [:]  // by recipient
        do {
            let server = try ServerProcess(["--data-dir", data.path, "--workers", "2"])
            // The recipients' devices exist (their events stay pending while they are away).
            for pair in pairs {
                let device = try TestClient(port: server.port)
                try device.hello(user: pair.recipient)
            }
            let senders = try pairs.map { pair in
                let client = try TestClient(port: server.port)
                try client.hello(user: pair.sender)
                return client
            }
            // Every sender keeps 32 requests in flight, all senders at once.
            var sent = Array(repeating: 0, count: pairs.count)
            var inFlight: [[UInt32: String]] = Array(repeating: [:], count: pairs.count)
            var total = 0
            while total < pairs.count * perSender / 2 {
                for (index, client) in senders.enumerated() {
                    while inFlight[index].count < 32 && sent[index] < perSender {
                        let id = "\(pairs[index].sender)-m\(sent[index])"
                        try client.send(.request(id: UInt32(sent[index]), .identifiedMessage(id, to: pairs[index].recipient)))
                        inFlight[index][UInt32(sent[index])] = id
                        sent[index] += 1
                    }
                    let reply = try client.expect(timeout: .seconds(10), "a reply") { frame -> Frame? in
                        switch frame {
                        case .ok, .error: return frame
                        default: return nil
                        }
                    }
                    guard case .ok(let requestID, _) = reply, let id = inFlight[index].removeValue(forKey: requestID) else {
                        Issue.record("refused: \(reply)"); return
                    }
                    accepted[pairs[index].recipient, default: []].insert(id)
                    total += 1
                }
            }
            #expect(kill(server.process.pid, SIGKILL) == 0)
            _ = server.process.waitForExit(timeoutSeconds: 10)
        }
        let server = try ServerProcess(["--data-dir", data.path, "--workers", "2", "--admin-listen", "127.0.0.1:0"])
        for pair in pairs {
            let device = try TestClient(port: server.port)
            try device.hello(user: pair.recipient)  // a new session: every pending event
            var received: [String] = []
            while let (seq, event) = try? device.nextEvent(timeout: .milliseconds(300)) {
                if case .message(let message) = event { received.append(message.messageID) }
                try device.ack(seq)
            }
            let expected = accepted[pair.recipient] ?? []
            #expect(expected.count > 0)
            #expect(expected.subtracting(received).isEmpty, "\(expected.subtracting(received).count) accepted messages lost")
            #expect(received.count == Set(received).count, "a message delivered twice")
        }
        // The receipts of those acknowledgements went to the senders' shards as steps, each
        // run by its owner loop.
        let adminPort = try #require(ServiceDeploymentTests.adminPort(in: server.log))
        let metrics = String(decoding: try HTTPRequest.send("GET", port: adminPort, "/metrics").body, as: UTF8.self)
        let run = metrics.split(separator: "\n").first { $0.hasPrefix("voipserver_routing_steps_total{how=\"run\"} ") }
        #expect(run.flatMap { Int($0.split(separator: " ").last!) }.map { $0 > 0 } == true, "\(run ?? "no steps metric")")
    }
}
