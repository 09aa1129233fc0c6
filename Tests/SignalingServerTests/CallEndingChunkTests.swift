import SignalingProtocol
@testable import SignalingServer
import SignalingStore
import SignalingSupport
import Testing

/// What the end of a call tells the callee's devices reaches them a chunk per hold
/// (`DeviceBroadcast`, `ShardStep.continueBroadcast`): alice (shard 0) calls bob (shard 1),
/// who has 300 connected devices, all rung before the call ends.
@Suite("A call's ending reaches the callee's devices a chunk per hold (routing core, pure)")
struct CallEndingChunkTests {
    static let chunk = SwitchboardState.fanOutChunk
    let alice = TwoShards.user("alice", onShard: 0)
    let bob = TwoShards.user("bob", onShard: 1)

    /// The CALL_ENDED reasons `device` has for call `callID` (every call: nil), in queue order.
    func endings(_ device: DeviceRecord, of callID: String? = nil) -> [CallEndReason] {
        TwoShards.events(device).compactMap { event in
            guard case .callEnded(let id, let reason, _, _) = event, callID == nil || id == callID else { return nil }
            return reason
        }
    }

    /// The calls whose CALL_ENDED `device` has, in queue order.
    func endedCalls(_ device: DeviceRecord) -> [String] {
        TwoShards.events(device).compactMap { event in
            guard case .callEnded(let id, _, _, _) = event else { return nil }
            return id
        }
    }

    func invitations(_ device: DeviceRecord, of callID: String) -> Int {
        TwoShards.events(device).filter { if case .callIncoming(callID, _, _, _, _) = $0 { true } else { false } }.count
    }

    /// alice's device and bob's `count` devices (connected; the newest first in bob's list).
    func devices(_ shards: inout TwoShards, count: Int) throws -> (caller: DeviceRecord, callee: [DeviceRecord]) {
        let caller = try shards.attach(alice, slot: 1, at: 1)
        let callee = try (0..<count).map { try shards.attach(bob, "d\($0)", slot: UInt32($0 + 2), at: 1) }
        return (caller, callee)
    }

    /// alice calls bob (`callID`), and the call rings every connected device of bob's.
    func ringAll(_ shards: inout TwoShards, _ callID: String, from caller: DeviceRecord) {
        var effects: [SwitchboardEffect] = []
        let invited = shards.request(alice, at: 2) { $0.invite(callID: callID, callee: bob, offer: [1], from: caller, now: TwoShards.at(2), into: &effects) }
        #expect(TwoShards.isOK(invited))
    }

    /// bob's device `device` accepts `callID`: the events the accept's hold queued, and the
    /// steps it hands on.
    func accept(_ callID: String, _ device: DeviceRecord, _ shards: inout TwoShards) -> (queued: Int, reply: Result<UInt64, RequestError>?, next: [ShardStep]) {
        var effects: [SwitchboardEffect] = []
        let before = shards.states[1].counters.eventsQueued
        let outcome = shards.states[1].accept(callID: callID, answer: [2], from: device, into: &effects)
        return (shards.states[1].counters.eventsQueued - before, outcome.reply, outcome.next)
    }

    @Test("an accept tells 299 other devices answeredElsewhere in ceil(299/128) holds of at most 128, each device once, the answering one not")
    func answeredElsewhereInChunks() throws {
        var shards = TwoShards()
        let (caller, callee) = try devices(&shards, count: 300)
        ringAll(&shards, "c1", from: caller)
        #expect(callee.allSatisfy { invitations($0, of: "c1") == 1 })
        let answering = callee[0]
        let accepted = accept("c1", answering, &shards)
        #expect(TwoShards.isOK(accepted.reply))
        let perHold = try [accepted.queued] + shards.eventsPerHold(accepted.next, on: 1)
        #expect(perHold == [128, 128, 43])
        #expect(perHold.allSatisfy { $0 <= Self.chunk })
        #expect(endings(answering).isEmpty)
        for device in callee where device !== answering { #expect(endings(device) == [.answeredElsewhere]) }
    }

    @Test("the ring timeout tells every device of the callee, connected or not, noAnswer once, at most 128 devices a hold")
    func ringTimeoutInChunks() throws {
        var effects: [SwitchboardEffect] = []
        var shards = TwoShards()
        let (caller, callee) = try devices(&shards, count: 300)
        ringAll(&shards, "c1", from: caller)
        for device in callee.prefix(100) { shards.states[1].detach(device, connection: device.connection!, now: TwoShards.at(3)) }
        let before = shards.states[1].counters.eventsQueued
        let pass = shards.states[1].expire(now: TwoShards.at(63), budget: SwitchboardState.expiryBudget, into: &effects)
        let perHold = try [shards.states[1].counters.eventsQueued - before] + shards.eventsPerHold(pass.next, on: 1)
        #expect(perHold == [128, 128, 44])
        for device in callee { #expect(endings(device) == [.noAnswer]) }
    }

    @Test("the ring timeout's walk of the callee's devices steps over devices forgotten while it goes on, the next one to reach among them")
    func forgottenMidTimeout() throws {
        var effects: [SwitchboardEffect] = []
        var shards = TwoShards()
        let (caller, callee) = try devices(&shards, count: 300)
        ringAll(&shards, "c1", from: caller)
        let pass = shards.states[1].expire(now: TwoShards.at(63), into: &effects)
        // The list is newest first: the first chunk reached callee[299] to callee[172].
        #expect(endings(callee[172]) == [.noAnswer] && endings(callee[171]).isEmpty)
        let forgotten = [callee[171], callee[50]]  // the walk's next device, and a later one
        for device in forgotten { shards.states[1].removeDevice(device) }
        let perHold = try shards.eventsPerHold(pass.next, on: 1)
        #expect(perHold == [128, 42])
        for device in callee {
            #expect(endings(device) == (forgotten.contains { $0 === device } ? [] : [.noAnswer]), "\(device.deviceID)")
        }
    }

    @Test("an expire pass that times out the rings of three big callees queues at most its budget and a chunk; the rest follows, once each")
    func ringTimeoutsShareTheBudget() throws {
        var effects: [SwitchboardEffect] = []
        var shards = TwoShards()
        let caller = try shards.attach(alice, slot: 1, at: 1)
        let callees = (["bob", "carol", "dave"]).map { TwoShards.user($0, onShard: 1) }
        var rung: [DeviceRecord] = []
        for (number, callee) in callees.enumerated() {
            rung += try (0..<300).map { try shards.attach(callee, "d\($0)", slot: UInt32(number * 1_000 + $0 + 2), at: 1) }
            let invited = shards.request(alice, at: 2) { $0.invite(callID: "c\(number)", callee: callee, offer: [1], from: caller, now: TwoShards.at(2), into: &effects) }
            #expect(TwoShards.isOK(invited))
        }
        var passes: [Int] = [], steps: [ShardStep] = []
        var moreDue = true
        while moreDue {
            let before = shards.states[1].counters.eventsQueued
            let pass = shards.states[1].expire(now: TwoShards.at(63), into: &effects)
            passes.append(shards.states[1].counters.eventsQueued - before)
            steps += pass.next
            moreDue = pass.moreDue
            try #require(passes.count < 10)
        }
        #expect(passes.count == 2, "the third timeout waits for a second pass")
        #expect(passes.allSatisfy { $0 <= SwitchboardState.expiryBudget + Self.chunk })
        try shards.eventsPerHold(steps, on: 1)
        for device in rung { #expect(endings(device) == [.noAnswer]) }
    }

    @Test("first accept wins mid-ending: a second accept while the answeredElsewhere chunks go out is refused and ends nothing twice")
    func secondAcceptMidEnding() throws {
        var shards = TwoShards()
        let (caller, callee) = try devices(&shards, count: 300)
        ringAll(&shards, "c1", from: caller)
        let accepted = accept("c1", callee[0], &shards)
        let late = try #require(callee.last { endings($0).isEmpty && $0 !== callee[0] }, "a device the first chunk did not reach")
        let second = accept("c1", late, &shards)
        #expect(TwoShards.code(second.reply) == .illegalCallTransition)
        #expect(second.queued == 0 && second.next.isEmpty)
        try shards.eventsPerHold(accepted.next, on: 1)
        #expect(endings(callee[0]).isEmpty)
        for device in callee.dropFirst() { #expect(endings(device) == [.answeredElsewhere]) }
    }

    @Test("a device that reconnects (resumed or in a new session) while the ending goes out gets it once and is not rung again")
    func reconnectMidEnding() throws {
        var effects: [SwitchboardEffect] = []
        var shards = TwoShards()
        let (caller, callee) = try devices(&shards, count: 300)
        ringAll(&shards, "c1", from: caller)
        let accepted = accept("c1", callee[0], &shards)
        let reached = try #require(callee.first { !endings($0).isEmpty })
        let waiting = callee.filter { endings($0).isEmpty && $0 !== callee[0] }
        try #require(waiting.count == 299 - Self.chunk)
        for (number, device) in [reached, waiting[0], waiting[1]].enumerated() {
            shards.states[1].detach(device, connection: device.connection!, now: TwoShards.at(3))
            // The first two resume, the third starts a new session.
            let resume: ResumePoint? = number < 2 ? ResumePoint(sessionID: device.sessionID, lastReceivedSeq: 0) : nil
            _ = try shards.states[1].attach(
                userID: bob, deviceID: device.deviceID, resume: resume, connection: TwoShards.connection(UInt32(9_000 + number)),
                now: TwoShards.at(3), into: &effects
            ).get()
        }
        try shards.eventsPerHold(accepted.next, on: 1)
        for device in callee.dropFirst() {
            #expect(endings(device) == [.answeredElsewhere])
            #expect(invitations(device, of: "c1") == 1)
        }
    }

    @Test("a device forgotten while the ending goes out is skipped")
    func forgottenMidEnding() throws {
        var shards = TwoShards()
        let (caller, callee) = try devices(&shards, count: 300)
        ringAll(&shards, "c1", from: caller)
        let accepted = accept("c1", callee[0], &shards)
        let forgotten = try #require(callee.last { endings($0).isEmpty && $0 !== callee[0] })
        let pending = shards.states[1].counters.pendingEvents
        shards.states[1].removeDevice(forgotten)
        #expect(shards.states[1].counters.pendingEvents == pending - forgotten.queue.count)
        try shards.eventsPerHold(accepted.next, on: 1)
        #expect(endings(forgotten).isEmpty)
        for device in callee.dropFirst() where device !== forgotten { #expect(endings(device) == [.answeredElsewhere]) }
        #expect(shards.states[1].activities[bob]?.broadcasts.isEmpty ?? true, "the broadcast is over")
    }

    @Test("two calls ended one after the other end in that order on every device, though the second's devices come in another order")
    func endingsInDecisionOrder() throws {
        var effects: [SwitchboardEffect] = []
        var shards = TwoShards()
        let (caller, callee) = try devices(&shards, count: 300)
        ringAll(&shards, "c1", from: caller)
        // c1 answered: its first chunk now, the rest waits (its steps held back).
        let accepted = accept("c1", callee[0], &shards)
        // The 100 newest devices (c1's first chunk) go away, so c2 rings the others first:
        // its first chunk reaches devices c1's ending has not reached yet.
        for device in callee.suffix(100) { shards.states[1].detach(device, connection: device.connection!, now: TwoShards.at(3)) }
        ringAll(&shards, "c2", from: caller)
        let cancelled = shards.request(alice, at: 3) { $0.cancel(callID: "c2", from: caller, into: &effects) }
        #expect(TwoShards.isOK(cancelled))
        try shards.eventsPerHold(accepted.next, on: 1)
        for device in callee where invitations(device, of: "c2") == 1 {
            let expected = device === callee[0] ? ["c2"] : ["c1", "c2"]
            #expect(endedCalls(device) == expected, "\(device.deviceID)")
        }
        #expect(callee.filter { invitations($0, of: "c2") == 1 }.count == 200)
        #expect(shards.states[1].activities[bob]?.broadcasts.isEmpty ?? true, "nothing left in progress for bob")
    }

    @Test("with a store, each hold of the ending is a commit unit of its chunk's events")
    func journaledChunks() throws {
        var effects: [SwitchboardEffect] = []
        var shards = TwoShards(journaling: true)
        let (caller, callee) = try devices(&shards, count: 300)
        ringAll(&shards, "c1", from: caller)
        _ = shards.states[1].takeCommitUnit()
        let accepted = accept("c1", callee[0], &shards)
        var appended: [Int] = []
        func appendedEvents(_ unit: CommitUnit?) -> Int {
            unit?.changes.filter { if case .appendEvent = $0 { true } else { false } }.count ?? 0
        }
        appended.append(appendedEvents(shards.states[1].takeCommitUnit()))
        var pending = accepted.next
        while !pending.isEmpty {
            let step = pending.removeFirst()
            let shard = ShardMap.shard(of: step.user, count: 2)
            pending += shards.states[shard].handle(step, now: TwoShards.at(3), into: &effects).next
            if shard == 1 { appended.append(appendedEvents(shards.states[1].takeCommitUnit())) }
        }
        #expect(appended == [128, 128, 43])
    }
}
