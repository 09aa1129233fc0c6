import SignalingProtocol
@testable import SignalingServer
import SignalingSupport
import Testing

/// A call rings the callee's connected devices a chunk per hold (`CallRecord.toRing`,
/// `ShardStep.continueRing`): alice (shard 0) calls bob (shard 1), who has `count`
/// connected devices.
@Suite("A call rings a callee's devices a chunk per hold (routing core, pure)")
struct RingChunkTests {
    static let chunk = SwitchboardState.fanOutChunk
    let alice = TwoShards.user("alice", onShard: 0)
    let bob = TwoShards.user("bob", onShard: 1)

    func isInvitation(_ event: Event) -> Bool {
        if case .callIncoming = event { true } else { false }
    }

    func invitations(_ device: DeviceRecord) -> Int { TwoShards.events(device).filter(isInvitation).count }

    /// bob's devices, and the steps alice's CALL_INVITE hands bob's shard.
    func setUp(_ shards: inout TwoShards, devices count: Int) throws -> (caller: DeviceRecord, callee: [DeviceRecord], steps: [ShardStep]) {
        var effects: [SwitchboardEffect] = []
        let caller = try shards.attach(alice, slot: 1, at: 1)
        let callee = try (0..<count).map { try shards.attach(bob, "d\($0)", slot: UInt32($0 + 2), at: 1) }
        let outcome = shards.states[0].invite(callID: "c1", callee: bob, offer: [1], from: caller, now: TwoShards.at(2), into: &effects)
        #expect(outcome.next.count == 1, "the invite step for bob's shard")
        return (caller, callee, outcome.next)
    }

    /// Runs one step on its shard; returns the invitations it queued on bob's shard and what it hands on.
    func hold(_ step: ShardStep, _ shards: inout TwoShards) -> (queued: Int, next: [ShardStep]) {
        var effects: [SwitchboardEffect] = []
        let before = shards.states[1].counters.eventsQueued
        let shard = ShardMap.shard(of: step.user, count: 2)
        let next = shards.states[shard].handle(step, now: TwoShards.at(2), into: &effects).next
        return (shards.states[1].counters.eventsQueued - before, next)
    }

    @Test("300 connected devices are rung in ceil(300/128) holds of bob's shard, at most 128 invitations each, every device once")
    func ringsInChunks() throws {
        var shards = TwoShards()
        let (_, callee, steps) = try setUp(&shards, devices: 300)
        var pending = steps
        var perHold: [Int] = []
        while !pending.isEmpty {
            let step = pending.removeFirst()
            let (queued, next) = hold(step, &shards)
            if ShardMap.shard(of: step.user, count: 2) == 1 { perHold.append(queued) }
            pending += next
            try #require(perHold.count < 100)
        }
        #expect(perHold == [128, 128, 44])
        #expect(callee.allSatisfy { invitations($0) == 1 })
    }

    @Test("answered mid-ring: the devices not rung yet never are; answeredElsewhere goes to the rung ones but the answering one")
    func answeredMidRing() throws {
        var effects: [SwitchboardEffect] = []
        var shards = TwoShards()
        let (_, callee, steps) = try setUp(&shards, devices: 300)
        var pending = steps
        // The invite step: the first chunk.
        let first = hold(pending.removeFirst(), &shards)
        pending += first.next
        let rung = callee.filter { invitations($0) == 1 }
        #expect(rung.count == Self.chunk)
        let answering = try #require(rung.first)
        _ = shards.request(bob, at: 3) { $0.accept(callID: "c1", answer: [2], from: answering, into: &effects) }
        while !pending.isEmpty { pending += hold(pending.removeFirst(), &shards).next }
        #expect(callee.filter { invitations($0) == 1 }.count == Self.chunk, "a device was rung after the answer")
        for device in rung where device !== answering {
            #expect(TwoShards.events(device).contains { if case .callEnded(_, .answeredElsewhere, _, _) = $0 { true } else { false } })
        }
    }

    @Test("a device that reconnects while the call still has to ring it is rung once")
    func reconnectMidRing() throws {
        var effects: [SwitchboardEffect] = []
        var shards = TwoShards()
        let (_, callee, steps) = try setUp(&shards, devices: 300)
        var pending = steps
        pending += hold(pending.removeFirst(), &shards).next
        let waiting = try #require(callee.first { invitations($0) == 0 })
        shards.states[1].detach(waiting, connection: waiting.connection!, now: TwoShards.at(2))
        _ = try shards.states[1].attach(
            userID: bob, deviceID: waiting.deviceID, resume: ResumePoint(sessionID: waiting.sessionID, lastReceivedSeq: 0),
            connection: TwoShards.connection(9_999), now: TwoShards.at(2), into: &effects
        ).get()
        #expect(invitations(waiting) == 1)
        while !pending.isEmpty { pending += hold(pending.removeFirst(), &shards).next }
        #expect(callee.allSatisfy { invitations($0) == 1 })
    }

    /// Rings all of bob's `count` devices (every step run).
    func rungCall(_ shards: inout TwoShards, devices count: Int) throws -> (caller: DeviceRecord, callee: [DeviceRecord], call: CallRecord) {
        let (caller, callee, steps) = try setUp(&shards, devices: count)
        var pending = steps
        while !pending.isEmpty { pending += hold(pending.removeFirst(), &shards).next }
        return (caller, callee, try #require(shards.states[1].calls["c1"]))
    }

    /// Runs bob's shard's expiry at `seconds`, and the steps it hands on.
    func expire(_ shards: inout TwoShards, at seconds: Double) {
        var effects: [SwitchboardEffect] = []
        let pass = shards.states[1].expire(now: TwoShards.at(seconds), into: &effects)
        _ = shards.run(pass.next, at: seconds)
    }

    @Test("a call's count of connected rung devices follows every loss, reconnect, takeover and operator's forget of a rung device (a grace check reads it, not a walk of the devices)")
    func connectedRungCounted() throws {
        var effects: [SwitchboardEffect] = []
        var shards = TwoShards()
        let (_, callee, call) = try rungCall(&shards, devices: 300)
        #expect(call.connectedRung == 300)
        for device in callee { shards.states[1].detach(device, connection: device.connection!, now: TwoShards.at(3)) }
        #expect(call.connectedRung == 0)
        // Back with its session, then taken over by a new connection of the same device.
        let back = callee[7]
        _ = try shards.states[1].attach(
            userID: bob, deviceID: back.deviceID, resume: ResumePoint(sessionID: back.sessionID, lastReceivedSeq: 0),
            connection: TwoShards.connection(9_000), now: TwoShards.at(4), into: &effects).get()
        #expect(call.connectedRung == 1)
        _ = try shards.states[1].attach(
            userID: bob, deviceID: back.deviceID, resume: nil, connection: TwoShards.connection(9_001), now: TwoShards.at(4), into: &effects).get()
        #expect(call.connectedRung == 1, "a takeover is no new connection of the device")
        #expect(invitations(back) == 1, "not rung twice")
    }

    @Test("300 rung devices that lose their connection: the call lives while one is back within its grace, and ends with peerDisconnected at the last one's grace check")
    func endsAtTheLastGraceCheck() throws {
        var effects: [SwitchboardEffect] = []
        var shards = TwoShards()
        let (caller, callee, call) = try rungCall(&shards, devices: 300)
        let grace = shards.states[1].configuration.callGrace
        let graceSeconds = Double(grace.components.seconds)
        for device in callee { shards.states[1].detach(device, connection: device.connection!, now: TwoShards.at(3)) }
        let back = callee[100]
        _ = try shards.states[1].attach(
            userID: bob, deviceID: back.deviceID, resume: ResumePoint(sessionID: back.sessionID, lastReceivedSeq: 0),
            connection: TwoShards.connection(9_000), now: TwoShards.at(4), into: &effects).get()
        expire(&shards, at: 3 + graceSeconds + 1)
        #expect(call.isLive, "one rung device is back")
        #expect(!TwoShards.events(caller).contains { TwoShards.isCallEnded($0, .peerDisconnected, peer: bob) })
        shards.states[1].detach(back, connection: back.connection!, now: TwoShards.at(20))
        expire(&shards, at: 20 + graceSeconds + 1)
        #expect(!call.isLive)
        #expect(TwoShards.events(caller).contains { TwoShards.isCallEnded($0, .peerDisconnected, peer: bob) })
    }
}
