import SignalingProtocol
import SignalingSupport
import Testing
@testable import SignalingServer

/// Two routing shards driven by hand, without sockets or threads: what one shard hands on
/// (`ShardStep`) is run on the other by `run`, as `Switchboard.run` does, so each test
/// sees every step of an operation that spans users on different shards.
struct TwoShards {
    static let epoch = Instant(nanoseconds: 1_000_000_000_000)
    var states: [SwitchboardState]

    /// `journaling`: as with a store (each hold's changes a commit unit, `takeCommitUnit`).
    init(journaling: Bool = false, _ configure: (inout SwitchboardConfiguration) -> Void = { _ in }) {
        var configuration = SwitchboardConfiguration()
        configure(&configuration)
        let total = MemoryTotal(), directory = CallDirectory()
        let ledgers = [MemoryLedger(total: total), MemoryLedger(total: total)]
        states = (0..<2).map { index in
            SwitchboardState(
                configuration: configuration, epoch: Self.epoch, journaling: journaling, shard: ShardMap(count: 2, index: index),
                ledger: ledgers[index], shardLedgers: ledgers, callDirectory: directory)
        }
    }

    static func at(_ seconds: Double) -> Instant { epoch + .milliseconds(Int64((seconds * 1000).rounded())) }

    /// The first of `name`, `name1`, `name2`, ... that lives in shard `index` of two.
    static func user(_ name: String, onShard index: Int) -> String {
        let candidates = [name] + (1...64).map { "\(name)\($0)" }
        return candidates.first { ShardMap.shard(of: $0, count: 2) == index }!
    }

    static func connection(_ slot: UInt32) -> ConnectionRef { ConnectionRef(loop: 0, slot: slot, generation: 1) }

    /// The deferred OK of message `id` from `sender`, as a store's server makes it (its
    /// answer goes nowhere; its deadline far off).
    static func deferredReply(_ id: String, sender: String) -> DeferredReply {
        DeferredReply(target: .completion { _ in }, serverTime: 1, sender: sender, messageID: id, deadline: at(100))
    }

    /// Message `id` to `recipient`, its id as its body.
    static func message(_ id: String, to recipient: String) -> OutgoingMessage {
        OutgoingMessage(messageID: id, recipient: recipient, contentType: "text/plain", body: Array(id.utf8))
    }

    /// Message `id` from `device` to `recipient`, a user of the other shard, sent at 2 s as
    /// a store's server sends it: the sender's shard admits it and ties its deferred OK to
    /// that hold (`deferReply(of:)`). Returns the hand-off to the recipient's shard and the
    /// deferred OK; throws (recording why) when the message was not handed on.
    mutating func sendDeferred(_ id: String, to recipient: String, from device: DeviceRecord) throws -> (handOff: ShardStep, reply: DeferredReply) {
        var effects: [SwitchboardEffect] = []
        let shard = ShardMap.shard(of: device.userID, count: 2)
        let acceptance = try #require(try? states[shard].send(Self.message(id, to: recipient), from: device, now: Self.at(2), into: &effects).get(), "\(id) was refused")
        let handOff = try #require(acceptance.handOff, "\(id) was not handed on to \(recipient)'s shard")
        let reply = Self.deferredReply(id, sender: device.userID)
        _ = states[shard].deferReply(of: acceptance) { reply }
        return (handOff, reply)
    }

    /// Runs `body` on the shard holding `user`, then every step it handed on.
    mutating func on<Result>(
        _ user: String, at seconds: Double, _ body: (inout SwitchboardState) -> (Result, [ShardStep])
    ) -> (Result, reply: Swift.Result<UInt64, RequestError>?) {
        let (result, next) = body(&states[ShardMap.shard(of: user, count: 2)])
        return (result, run(next, at: seconds))
    }

    /// Runs `steps`, and those they hand on, each on its user's shard (first in, first out).
    mutating func run(_ steps: [ShardStep], at seconds: Double) -> Swift.Result<UInt64, RequestError>? {
        var effects: [SwitchboardEffect] = []
        var pending = steps
        var reply: Swift.Result<UInt64, RequestError>?
        while !pending.isEmpty {
            let step = pending.removeFirst()
            let outcome = states[ShardMap.shard(of: step.user, count: 2)].handle(step, now: Self.at(seconds), into: &effects)
            if reply == nil { reply = outcome.reply }
            pending += outcome.next
        }
        return reply
    }

    /// Runs `steps` and those they hand on, one hold each, first in first out, at 3 s; returns
    /// how many events each hold queued on shard `index`, leaving out the holds that queued
    /// none there (what a test of an operation in chunks counts per hold).
    @discardableResult
    mutating func eventsPerHold(_ steps: [ShardStep], on index: Int) throws -> [Int] {
        var effects: [SwitchboardEffect] = []
        var pending = steps, perHold: [Int] = [], holds = 0
        while !pending.isEmpty {
            let step = pending.removeFirst()
            let before = states[index].counters.eventsQueued
            pending += states[ShardMap.shard(of: step.user, count: 2)].handle(step, now: Self.at(3), into: &effects).next
            let queued = states[index].counters.eventsQueued - before
            if queued > 0 { perHold.append(queued) }
            holds += 1
            try #require(holds < 1_000, "the steps do not end")
        }
        return perHold
    }

    /// Runs a request that answers with a `StepOutcome`: its reply, wherever it came from.
    mutating func request(_ user: String, at seconds: Double, _ body: (inout SwitchboardState) -> StepOutcome) -> Swift.Result<UInt64, RequestError>? {
        let (first, reply) = on(user, at: seconds) { state -> (StepOutcome, [ShardStep]) in
            let outcome = body(&state)
            return (outcome, outcome.next)
        }
        return first.reply ?? reply
    }

    mutating func attach(_ user: String, _ device: String = "d1", slot: UInt32, at seconds: Double) throws -> DeviceRecord {
        var effects: [SwitchboardEffect] = []
        let grant = try states[ShardMap.shard(of: user, count: 2)].attach(
            userID: user, deviceID: device, resume: nil, connection: Self.connection(slot), now: Self.at(seconds), into: &effects
        ).get()
        #expect(grant.next.isEmpty)
        return grant.record
    }

    /// The events waiting for `device`, decoded as a device would read them.
    static func events(_ device: DeviceRecord) -> [Event] {
        var events: [Event] = []
        device.queue.forEach(after: device.ackedSeq) { seq, queued in
            var bytes: [UInt8] = []
            FrameEncoder.append(event: queued.encoded, seq: seq, to: &bytes)
            if let decoded = try? bytes.withUnsafeBytes({ try FrameDecoder().decode($0) }),
                case .event(_, let event) = decoded.frame
            {
                events.append(event)
            }
            return true
        }
        return events
    }

    /// The error code of a reply (nil: OK, or no reply).
    static func code(_ reply: Swift.Result<UInt64, RequestError>?) -> ErrorCode? {
        guard case .failure(let error)? = reply else { return nil }
        return error.code
    }

    static func isOK(_ reply: Swift.Result<UInt64, RequestError>?) -> Bool {
        guard case .success? = reply else { return false }
        return true
    }

    static func isCallEnded(_ event: Event?, _ reason: CallEndReason, peer: String) -> Bool {
        guard case .callEnded(_, let got, let gotPeer, _) = event else { return false }
        return got == reason && gotPeer == peer
    }
}

@Suite("Routing shards: operations across users as steps (routing core, pure)")
struct ShardStepTests {
    let alice = TwoShards.user("alice", onShard: 0)
    let bob = TwoShards.user("bob", onShard: 1)

    func message(_ id: String, to recipient: String) -> OutgoingMessage {
        OutgoingMessage(messageID: id, recipient: recipient, contentType: "text/plain", body: Array("hi".utf8))
    }

    /// alice (shard 0) calls bob (shard 1) at `seconds`; bob's `devices` are connected and ring.
    func call(
        _ shards: inout TwoShards, calleeDevices devices: [String] = ["d1"], at seconds: Double = 2
    ) throws -> (caller: DeviceRecord, callee: [DeviceRecord]) {
        var effects: [SwitchboardEffect] = []
        let caller = try shards.attach(alice, slot: 1, at: 1)
        let callee = try devices.enumerated().map { try shards.attach(bob, $1, slot: UInt32($0 + 2), at: 1) }
        let invited = shards.request(alice, at: seconds) {
            $0.invite(callID: "c1", callee: bob, offer: [1], from: caller, now: TwoShards.at(seconds), into: &effects)
        }
        #expect(TwoShards.isOK(invited))
        return (caller, callee)
    }

    @Test("debug builds stop a thread that takes a second routing shard's lock")
    func noTwoShards() async {
        #if DEBUG
        await #expect(processExitsWith: .failure) {
            let switchboard = Switchboard(
                configuration: SwitchboardConfiguration(), epoch: Instant(nanoseconds: 1), journaling: false, shardCount: 2)
            switchboard.withState(shard: 0, wall: 0) { _ in
                switchboard.withState(shard: 1, wall: 0) { _ in }
            }
        }
        // One shard after another is the rule, and passes.
        let switchboard = Switchboard(
            configuration: SwitchboardConfiguration(), epoch: Instant(nanoseconds: 1), journaling: false, shardCount: 2)
        switchboard.withState(shard: 0, wall: 0) { _ in }
        switchboard.withState(shard: 1, wall: 0) { _ in }
        #endif
    }

    @Test("the shard of a user is stable and spreads users over the shards")
    func shardFunction() {
        #expect(ShardMap.shard(of: "alice", count: 2) == ShardMap.shard(of: "alice", count: 2))
        #expect(ShardMap.shard(of: "anyone", count: 1) == 0)
        let spread = Set((0..<64).map { ShardMap.shard(of: "user\($0)", count: 4) })
        #expect(spread == [0, 1, 2, 3])
        #expect(ShardMap.shard(of: alice, count: 2) != ShardMap.shard(of: bob, count: 2))
    }

    @Test("a message to another shard's user: queued there, copied to the sender's other device, answered once; the receipt comes back")
    func messageAndReceipt() throws {
        var effects: [SwitchboardEffect] = []
        var shards = TwoShards()
        let laptop = try shards.attach(alice, "laptop", slot: 1, at: 1)
        let phone = try shards.attach(alice, "phone", slot: 2, at: 1)
        let bobDevice = try shards.attach(bob, slot: 3, at: 1)

        let (acceptance, reply) = shards.on(alice, at: 2) { state in
            let acceptance = try! state.send(message("m1", to: bob), from: laptop, now: TwoShards.at(2), into: &effects).get()
            return (acceptance, acceptance.handOff.map { [$0] } ?? [])
        }
        #expect(acceptance.handOff != nil, "the recipient's shard decides")
        #expect(acceptance.event != nil, "the copy queued to alice's phone, awaiting the decision")
        guard case .success = reply else { Issue.record("not accepted: \(String(describing: reply))"); return }
        guard case .message(let delivered) = TwoShards.events(bobDevice).first else { Issue.record("bob got nothing"); return }
        #expect(delivered.messageID == "m1" && delivered.sender == alice && delivered.senderDevice == "laptop")
        guard case .message = TwoShards.events(phone).first else { Issue.record("no copy on the sender's other device"); return }
        #expect(TwoShards.events(laptop).isEmpty, "no copy to the sending device")

        // A retry is a duplicate on the sender's shard: nothing is handed on, nothing queued twice.
        let retry = try shards.states[0].send(message("m1", to: bob), from: laptop, now: TwoShards.at(3), into: &effects).get()
        #expect(retry.handOff == nil && retry.event == nil)
        #expect(TwoShards.events(bobDevice).count == 1)

        // Bob acknowledges: the receipt is a step to alice's shard, for both her devices.
        let (ack, _) = shards.on(bob, at: 4) { state in
            let (violation, next) = state.ack(bobDevice, connection: TwoShards.connection(3), through: bobDevice.lastSeq, into: &effects)
            return (violation, next)
        }
        #expect(ack == nil)
        for device in [laptop, phone] {
            guard case .messageDelivered(let messageID, let recipient, let recipientDevice, _) = TwoShards.events(device).last else {
                Issue.record("\(device.deviceID) got no receipt"); continue
            }
            #expect(messageID == "m1" && recipient == bob && recipientDevice == "d1")
        }
        #expect(shards.states[0].counters.messagesDeduplicated == 1)
        #expect(shards.states[1].counters.messagesAccepted == 1)
    }

    @Test("a message the recipient's shard refuses is answered with the refusal, and its id is free again")
    func refusedAcrossShards() throws {
        var effects: [SwitchboardEffect] = []
        var shards = TwoShards { $0.maxPendingEvents = 1 }
        let sender = try shards.attach(alice, slot: 1, at: 1)
        let recipient = try shards.attach(bob, slot: 2, at: 1)
        func send(_ id: String, at seconds: Double) -> Result<UInt64, RequestError>? {
            sendToBob(&shards, id, from: sender, at: seconds)
        }
        #expect(TwoShards.isOK(send("m1", at: 2)))
        #expect(TwoShards.code(send("m2", at: 3)) == .recipientBacklogFull)
        _ = shards.states[1].ack(recipient, connection: TwoShards.connection(2), through: recipient.lastSeq, into: &effects)
        // Refused, so not remembered: the same id is a new message now, not a duplicate.
        #expect(TwoShards.isOK(send("m2", at: 4)))
        #expect(TwoShards.events(recipient).count == 1)
        #expect(shards.states[0].counters.messagesDeduplicated == 0)
    }

    /// alice's `device` sends message `id` to bob, and every step runs: the answer.
    func sendToBob(_ shards: inout TwoShards, _ id: String, from device: DeviceRecord, at seconds: Double) -> Result<UInt64, RequestError>? {
        var effects: [SwitchboardEffect] = []
        return shards.request(alice, at: seconds) { state in
            switch state.send(message(id, to: bob), from: device, now: TwoShards.at(seconds), into: &effects) {
            case .success(let acceptance):
                // Handed on: the recipient's shard answers.
                StepOutcome(
                    reply: acceptance.handOff == nil ? .success(acceptance.serverTime) : nil,
                    next: acceptance.handOff.map { [$0] } ?? [])
            case .failure(let refusal): .answered(.failure(refusal))
            }
        }
    }

    /// What `device`'s pump would write now (numbers and events), as the loop asks for it.
    func writable(_ state: SwitchboardState, _ device: DeviceRecord, slot: UInt32) -> [(UInt64, FrameType)] {
        var written: [(UInt64, FrameType)] = []
        _ = state.nextBatch(for: device, connection: TwoShards.connection(slot), after: 0, limit: 100) { seq, event in
            written.append((seq, event.encoded.type))
            return true
        }
        return written
    }

    @Test("a message to another shard's user takes its room in the sender's other devices at once: a queue that fills before the decision still gets the copy, in order, nothing dropped")
    func copiesReservedBeforeTheDecision() throws {
        var effects: [SwitchboardEffect] = []
        var shards = TwoShards {
            $0.maxPendingEvents = 2
            $0.maxPendingPerSender = 2
        }
        let carol = TwoShards.user("carol", onShard: 0)
        let laptop = try shards.attach(alice, "laptop", slot: 1, at: 1)
        let phone = try shards.attach(alice, "phone", slot: 2, at: 1)
        let bobDevice = try shards.attach(bob, slot: 3, at: 1)

        // First step, on alice's shard: admitted, handed to bob's shard.
        let first = try shards.states[0].send(message("m1", to: bob), from: laptop, now: TwoShards.at(2), into: &effects).get()
        let handOff = try #require(first.handOff)
        // Before bob's shard decides, carol (alice's shard) writes to alice: her phone's
        // queue fills up. The copy of m1 already holds its place, so the second is refused.
        let fromCarol = shards.states[0].send(
            message("c1", to: alice), sender: carol, senderDevice: "web", sendingDevice: nil, now: TwoShards.at(2), into: &effects)
        #expect((try? fromCarol.get()) != nil)
        let overflow = shards.states[0].send(
            message("c2", to: alice), sender: carol, senderDevice: "web", sendingDevice: nil, now: TwoShards.at(2), into: &effects)
        #expect(TwoShards.code(overflow.map { $0.serverTime }) == .recipientBacklogFull)
        // A repeat of m1 before the decision could get a wrong OK: refused, nothing changes.
        let repeated = shards.states[0].send(message("m1", to: bob), from: phone, now: TwoShards.at(2), into: &effects)
        #expect(TwoShards.code(repeated.map { $0.serverTime }) == .rateLimited)
        // Nothing goes out to the phone yet: the copy awaits the decision, carol's message
        // comes after it.
        #expect(writable(shards.states[0], phone, slot: 2).isEmpty)

        // Bob's shard accepts; alice's shard settles.
        #expect(TwoShards.isOK(shards.run([handOff], at: 2)))
        #expect(TwoShards.events(bobDevice).count == 1)
        let phoneEvents = TwoShards.events(phone)
        guard phoneEvents.count == 2, case .message(let copy) = phoneEvents[0], case .message(let carols) = phoneEvents[1] else {
            Issue.record("the phone has \(phoneEvents)"); return
        }
        #expect(copy.messageID == "m1" && copy.sender == alice && copy.recipient == bob)
        #expect(carols.messageID == "c1")
        #expect(writable(shards.states[0], phone, slot: 2).map(\.1) == [.message, .message])
        #expect(shards.states[0].counters.eventsDropped == 0)
        // Decided: a repeat now is the duplicate it is.
        let duplicate = try shards.states[0].send(message("m1", to: bob), from: phone, now: TwoShards.at(3), into: &effects).get()
        #expect(duplicate.handOff == nil && duplicate.serverTime == first.serverTime)
    }

    @Test("a message the recipient's shard refuses leaves nothing on the sender's other devices: the copy queued in the first step is withdrawn, never written, its room free again")
    func refusedCopyNeverWritten() throws {
        var effects: [SwitchboardEffect] = []
        var shards = TwoShards { $0.maxPendingEvents = 1 }
        let laptop = try shards.attach(alice, "laptop", slot: 1, at: 1)
        let phone = try shards.attach(alice, "phone", slot: 2, at: 1)
        _ = try shards.attach(bob, slot: 3, at: 1)
        func send(_ id: String, at seconds: Double) -> Result<UInt64, RequestError>? {
            sendToBob(&shards, id, from: laptop, at: seconds)
        }
        #expect(TwoShards.isOK(send("m1", at: 2)))
        _ = shards.states[0].ack(phone, connection: TwoShards.connection(2), through: phone.lastSeq, into: &effects)
        // Bob's queue is full: m2 is refused, and its copy on the phone is cancelled.
        let before = phone.lastSeq
        #expect(TwoShards.code(send("m2", at: 3)) == .recipientBacklogFull)
        #expect(phone.queue.isEmpty && phone.lastSeq == before + 1, "the copy's number is a hole")
        #expect(writable(shards.states[0], phone, slot: 2).isEmpty)
        // Its room is free: the phone takes the next event, and writes it.
        shards.states[0].deliverReceipt(
            DeliveryReceipt(sender: alice, messageID: "m1", recipient: bob, shards: shards.states[0].shardMap), recipientDevice: "d1", serverTime: 1, into: &effects)
        #expect(writable(shards.states[0], phone, slot: 2).map(\.1) == [.messageDelivered])
        #expect(shards.states[0].counters.eventsDropped == 0)
        // The id is free again.
        #expect(shards.states[0].activities[alice]?.undecidedMessages.isEmpty ?? true)
        #expect(shards.states[0].activities[alice]?.recentMessageIDs["m2"] == nil)
    }

    @Test("a sender's device forgotten before the recipient's shard refuses the message: its copy is not withdrawn twice")
    func copyOfForgottenDevice() throws {
        var effects: [SwitchboardEffect] = []
        var shards = TwoShards { $0.maxPendingEvents = 1 }
        let laptop = try shards.attach(alice, "laptop", slot: 1, at: 1)
        let phone = try shards.attach(alice, "phone", slot: 2, at: 1)
        let bobDevice = try shards.attach(bob, slot: 3, at: 1)
        _ = shards.states[1].enqueue(QueuedEvent(.messageDelivered(messageID: "x", recipient: "y", recipientDevice: "z", serverTime: 0), createdAt: 0), to: bobDevice, into: &effects)  // bob is full
        let pendingBefore = shards.states[0].counters.pendingEvents
        let first = try shards.states[0].send(message("m1", to: bob), from: laptop, now: TwoShards.at(2), into: &effects).get()
        #expect(shards.states[0].counters.pendingEvents == pendingBefore + 1, "the copy on the phone")
        shards.states[0].removeDevice(phone)
        #expect(TwoShards.code(shards.run([try #require(first.handOff)], at: 2)) == .recipientBacklogFull)
        #expect(shards.states[0].counters.pendingEvents == pendingBefore)
    }

    @Test("a sender with many devices, one forgotten before the refusal (the settle step checks them against one set): only the others' copies are withdrawn, each once")
    func copiesOfManyDevicesOneForgotten() throws {
        var effects: [SwitchboardEffect] = []
        var shards = TwoShards { $0.maxPendingEvents = 1 }
        let laptop = try shards.attach(alice, "laptop", slot: 1, at: 1)
        let others = try (0..<8).map { try shards.attach(alice, "d\($0)", slot: UInt32(10 + $0), at: 1) }
        let bobDevice = try shards.attach(bob, slot: 3, at: 1)
        _ = shards.states[1].enqueue(QueuedEvent(.messageDelivered(messageID: "x", recipient: "y", recipientDevice: "z", serverTime: 0), createdAt: 0), to: bobDevice, into: &effects)  // bob is full
        let pendingBefore = shards.states[0].counters.pendingEvents
        let first = try shards.states[0].send(message("m1", to: bob), from: laptop, now: TwoShards.at(2), into: &effects).get()
        #expect(shards.states[0].counters.pendingEvents == pendingBefore + others.count, "a copy on each other device")
        shards.states[0].removeDevice(others[3])
        #expect(TwoShards.code(shards.run([try #require(first.handOff)], at: 2)) == .recipientBacklogFull)
        #expect(shards.states[0].counters.pendingEvents == pendingBefore)
        for (index, device) in others.enumerated() where index != 3 { #expect(device.queue.isEmpty, "a copy left on \(device.deviceID)") }
    }

    @Test("a call to another shard's user with two devices: both ring, the first accept wins, the other hears answeredElsewhere")
    func firstAcceptWins() throws {
        var effects: [SwitchboardEffect] = []
        var shards = TwoShards()
        let (caller, callee) = try call(&shards, calleeDevices: ["phone", "tablet"])
        let (phone, tablet) = (callee[0], callee[1])
        #expect(shards.states[1].calls["c1"] != nil, "the call lives in the callee's shard")
        #expect(shards.states[0].calls["c1"] == nil)
        for device in [phone, tablet] {
            guard case .callIncoming("c1", alice, "d1", _, _) = TwoShards.events(device).first else { Issue.record("\(device.deviceID) did not ring"); return }
        }
        // The same id from anyone else is in use, whichever shard asks.
        let carol = TwoShards.user("carol", onShard: 0)
        let other = try shards.attach(carol, slot: 4, at: 1)
        let reused = shards.request(carol, at: 2) { $0.invite(callID: "c1", callee: alice, offer: [], from: other, now: TwoShards.at(2), into: &effects) }
        #expect(TwoShards.code(reused) == .callIdInUse)

        #expect(TwoShards.isOK(shards.request(bob, at: 3) { $0.accept(callID: "c1", answer: [2], from: tablet, into: &effects) }))
        let late = shards.request(bob, at: 3) { $0.accept(callID: "c1", answer: [3], from: phone, into: &effects) }
        #expect(TwoShards.code(late) == .illegalCallTransition)
        #expect(TwoShards.events(caller) == [.callAccepted(callID: "c1", device: "tablet", answer: [2])])
        #expect(TwoShards.isCallEnded(TwoShards.events(phone).last, .answeredElsewhere, peer: alice))

        // The caller hangs up from its shard: a step to the callee's.
        #expect(TwoShards.isOK(shards.request(alice, at: 4) { $0.hangUp(callID: "c1", from: caller, into: &effects) }))
        #expect(TwoShards.isCallEnded(TwoShards.events(tablet).last, .hungUp, peer: alice))
        #expect(shards.states[1].calls.isEmpty)
        #expect(shards.states[0].activities[alice] == nil, "the caller's shard forgot the call")
        #expect(!shards.states[0].callDirectory.contains("c1"))
    }

    @Test("the caller's shard applies the callee's notices in the callee's order, even when their steps run the other way round")
    func noticesInOrder() throws {
        var effects: [SwitchboardEffect] = []
        var shards = TwoShards()
        let (caller, callee) = try call(&shards, calleeDevices: ["phone", "tablet"])
        let (phone, tablet) = (callee[0], callee[1])
        // Two holds of bob's shard (two loops): the phone rings, then the tablet rejects.
        let rang = shards.states[1].ringing(callID: "c1", from: phone, into: &effects)
        let rejected = shards.states[1].reject(callID: "c1", reason: .declined, from: tablet, into: &effects)
        #expect(rang.next.count == 1 && rejected.next.count == 2)
        // The second hold's steps run first (another thread got there first).
        _ = shards.run(rejected.next, at: 3)
        #expect(TwoShards.events(caller).isEmpty, "CALL_ENDED waits for CALL_RANG")
        #expect(shards.states[0].activities[alice] != nil, "the call is not forgotten before its earlier notice")
        _ = shards.run(rang.next, at: 3)
        let events = TwoShards.events(caller)
        #expect(events.count == 2)
        #expect(events.first == .callRang(callID: "c1", device: "phone"))
        #expect(TwoShards.isCallEnded(events.last, .declined, peer: bob))
        #expect(shards.states[0].activities[alice] == nil)
    }

    @Test("ring timeout in the callee's shard: the caller on the other shard hears noAnswer, and forgets the call")
    func ringTimeout() throws {
        var effects: [SwitchboardEffect] = []
        var shards = TwoShards { $0.ringTimeout = .seconds(60) }
        let (caller, callees) = try call(&shards, at: 10)
        let callee = callees[0]
        #expect(shards.states[1].expire(now: TwoShards.at(69.9), into: &effects).next.isEmpty)
        let pass = shards.states[1].expire(now: TwoShards.at(70.001), into: &effects)
        #expect(pass.next.map(\.user) == [alice, alice], "the caller's event, then its shard's bookkeeping")
        _ = shards.run(pass.next, at: 70.001)
        #expect(TwoShards.isCallEnded(TwoShards.events(caller).last, .noAnswer, peer: bob))
        #expect(TwoShards.isCallEnded(TwoShards.events(callee).last, .noAnswer, peer: alice))
        #expect(shards.states[0].activities[alice] == nil)
        // The id is free again.
        #expect(TwoShards.isOK(shards.request(alice, at: 71) { $0.invite(callID: "c1", callee: bob, offer: [], from: caller, now: TwoShards.at(71), into: &effects) }))
    }

    @Test("a caller that loses its connection and stays away: its shard's grace check ends the call with peerDisconnected in the callee's")
    func callerDisconnects() throws {
        var effects: [SwitchboardEffect] = []
        var shards = TwoShards { $0.callGrace = .seconds(10) }
        let (caller, callees) = try call(&shards)
        let callee = callees[0]
        _ = shards.request(bob, at: 3) { $0.accept(callID: "c1", answer: [], from: callee, into: &effects) }
        shards.states[0].detach(caller, connection: TwoShards.connection(1), now: TwoShards.at(20))
        #expect(shards.states[0].expire(now: TwoShards.at(29.9), into: &effects).next.isEmpty, "not before the grace ends")
        #expect(shards.states[1].calls["c1"] != nil)
        let pass = shards.states[0].expire(now: TwoShards.at(30.001), into: &effects)
        #expect(pass.next.map(\.user) == [bob])
        _ = shards.run(pass.next, at: 30.001)
        #expect(TwoShards.isCallEnded(TwoShards.events(callee).last, .peerDisconnected, peer: alice))
        #expect(shards.states[1].calls.isEmpty)
        #expect(shards.states[0].activities[alice] == nil)
    }

    @Test("a caller back within its grace keeps the call")
    func callerReturns() throws {
        var effects: [SwitchboardEffect] = []
        var shards = TwoShards { $0.callGrace = .seconds(10) }
        let (caller, callees) = try call(&shards)
        let callee = callees[0]
        _ = shards.request(bob, at: 3) { $0.accept(callID: "c1", answer: [], from: callee, into: &effects) }
        shards.states[0].detach(caller, connection: TwoShards.connection(1), now: TwoShards.at(20))
        _ = try shards.attach(alice, slot: 5, at: 25)
        #expect(shards.states[0].expire(now: TwoShards.at(31), into: &effects).next.isEmpty)
        #expect(shards.states[1].calls["c1"] != nil)
    }
}

@Suite("Routing shards over real sockets (two loops, two shards)")
struct ShardEndToEndTests {
    let alice = TwoShards.user("alice", onShard: 0)
    let bob = TwoShards.user("bob", onShard: 1)

    @Test("a call to a user whose devices were accepted on both loops, from the other shard: all ring, the first accept wins, a caller that vanishes is reported")
    func calleeOnTwoLoops() throws {
        let server = try TestServer(workers: 2)
        #expect(server.server.routingShards == 2)
        // Bob's devices first, until both loops accepted some (the kernel picks the loop):
        // those accepted on loop 0 moved to bob's home loop, loop 1.
        var devices: [TestClient] = []
        while devices.count < 2 || server.server.connectionsMovedPerLoop[0] == 0 {
            try #require(devices.count < 40, "the kernel put \(devices.count + 1) connections on one loop")
            devices.append(try server.connect(user: bob, device: "d\(devices.count)").0)
        }
        #expect(server.server.openConnectionsPerLoop == [0, devices.count])
        var caller: TestClient? = try server.connect(user: alice).0
        #expect(try caller!.request(1, .callInvite(callID: "c1", callee: bob, offer: [1])).isOK)
        for device in devices {
            guard case .callIncoming("c1", alice, "d1", _, _) = try device.nextEvent().event else {
                Issue.record("a device did not ring"); return
            }
        }
        // Every device accepts; exactly one wins, whichever loop its accept ran on.
        let accepted = try devices.enumerated().filter { index, device in
            try device.request(1, .callAccept(callID: "c1", answer: [2])).isOK
        }
        #expect(accepted.count == 1)
        guard let winner = accepted.first else { return }
        #expect(try caller!.nextEvent().event == .callAccepted(callID: "c1", device: "d\(winner.offset)", answer: [2]))
        for (index, device) in devices.enumerated() where index != winner.offset {
            guard case .callEnded("c1", .answeredElsewhere, alice, _) = try device.nextEvent().event else {
                Issue.record("d\(index) was not told"); return
            }
        }
        // The caller's connection goes; after the grace its shard ends the call in bob's.
        caller = nil  // closes the socket
        try server.waitFor("alice's disconnect") { $0.establishedConnections == devices.count }
        try server.advance(by: .seconds(11))
        guard case .callEnded("c1", .peerDisconnected, alice, _) = try winner.element.nextEvent().event else {
            Issue.record("the answering device did not learn that the caller vanished"); return
        }
    }

    @Test("messages and receipts between users of different shards keep their order")
    func messagesAcrossShards() throws {
        let server = try TestServer(workers: 2)
        let (sender, _) = try server.connect(user: alice)
        let (recipient, _) = try server.connect(user: bob)
        for number in 1...20 {
            #expect(try sender.request(UInt32(number), .messageSend(OutgoingMessage(
                messageID: "m\(number)", recipient: bob, contentType: "text/plain", body: [UInt8(number)]))).isOK)
        }
        for number in 1...20 {
            let (seq, event) = try recipient.nextEvent()
            #expect(seq == UInt64(number))
            guard case .message(let message) = event else { Issue.record("not a message"); return }
            #expect(message.messageID == "m\(number)")
            try recipient.ack(seq)
        }
        for number in 1...20 {
            guard case .messageDelivered(let messageID, _, _, _) = try sender.nextEvent().event else {
                Issue.record("no receipt"); return
            }
            #expect(messageID == "m\(number)")
        }
    }
}
