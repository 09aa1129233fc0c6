import SignalingProtocol
import SignalingPush
import SignalingStore
@testable import SignalingServer
import SignalingSupport
import Testing

/// The operator forgets a party of a live call (the admin API's `DELETE /v1/users/{id}`,
/// `SwitchboardState.forgetUser`): the call ends at once for the other party with
/// CALL_ENDED peerDisconnected, whatever state its devices were in (docs/PROTOCOL.md 6.1,
/// "Server-generated endings"). bob (the callee) lives in shard 1; the caller in shard 0
/// (across shards) or 1 (the same shard).
@Suite("Forgetting a party of a live call ends it at once (routing core, pure)")
struct ForgetCallTests {
    let bob = TwoShards.user("bob", onShard: 1)

    /// The caller of shard `index`, whose device rings bob's `devices` (all connected) from 2 s.
    func call(
        _ shards: inout TwoShards, callerShard index: Int, calleeDevices devices: [String] = ["phone", "tablet"]
    ) throws -> (caller: DeviceRecord, callee: [DeviceRecord]) {
        var effects: [SwitchboardEffect] = []
        let alice = TwoShards.user("alice", onShard: index)
        let caller = try shards.attach(alice, slot: 1, at: 1)
        let callee = try devices.enumerated().map { try shards.attach(bob, $1, slot: UInt32($0 + 2), at: 1) }
        let invited = shards.request(alice, at: 2) { $0.invite(callID: "c1", callee: bob, offer: [1], from: caller, now: TwoShards.at(2), into: &effects) }
        #expect(TwoShards.isOK(invited))
        return (caller, callee)
    }

    /// The operator forgets `user` at `seconds`; every step it hands on is run. Returns the
    /// number of devices removed.
    func forget(_ user: String, _ shards: inout TwoShards, at seconds: Double = 3) -> Int? {
        var effects: [SwitchboardEffect] = []
        let (result, _) = shards.on(user, at: seconds) { state -> (Result<Int, AdminRefusal>, [ShardStep]) in
            let (removed, next) = state.forgetUser(user, now: TwoShards.at(seconds), into: &effects)
            return (removed, next)
        }
        return try? result.get()
    }

    /// Nothing is left of call c1 in either shard: no record, no outgoing call, no id.
    func expectGone(_ shards: TwoShards, caller: DeviceRecord) {
        #expect(shards.states.allSatisfy { $0.calls["c1"] == nil })
        #expect(shards.states.allSatisfy { $0.activities[caller.userID]?.outgoingCalls.isEmpty ?? true }, "the caller's shard kept the call")
        #expect(!shards.states[0].callDirectory.contains("c1"), "the call id is still taken")
    }

    func isCallEnded(_ event: Event) -> Bool {
        if case .callEnded = event { true } else { false }
    }

    @Test("the callee forgotten while its rung devices are connected: the caller hears peerDisconnected at once, and the call is gone", arguments: [0, 1])
    func calleeForgottenWhileRinging(callerShard: Int) throws {
        var effects: [SwitchboardEffect] = []
        var shards = TwoShards()
        let (caller, _) = try call(&shards, callerShard: callerShard)
        #expect(forget(bob, &shards) == 2)
        let ended = TwoShards.events(caller).filter(isCallEnded)
        #expect(ended.count == 1)
        #expect(TwoShards.isCallEnded(ended.first, .peerDisconnected, peer: bob))
        expectGone(shards, caller: caller)
        // Nothing more comes at the ring timeout.
        for index in 0..<2 { _ = shards.run(shards.states[index].expire(now: TwoShards.at(100), into: &effects).next, at: 100) }
        #expect(TwoShards.events(caller).filter(isCallEnded).count == 1)
    }

    @Test("the callee forgotten while one rung device is connected and another in its grace: peerDisconnected at once", arguments: [0, 1])
    func calleeForgottenOneInGrace(callerShard: Int) throws {
        var shards = TwoShards()
        let (caller, callee) = try call(&shards, callerShard: callerShard)
        shards.states[1].detach(callee[1], connection: callee[1].connection!, now: TwoShards.at(2.5))
        #expect(forget(bob, &shards) == 2)
        #expect(TwoShards.isCallEnded(TwoShards.events(caller).last, .peerDisconnected, peer: bob))
        expectGone(shards, caller: caller)
    }

    @Test("the callee forgotten while its call still has devices to ring in later holds: peerDisconnected at once, and the later holds ring nobody")
    func calleeForgottenMidRing() throws {
        var effects: [SwitchboardEffect] = []
        var shards = TwoShards { $0.fanOutChunk = 2 }
        let alice = TwoShards.user("alice", onShard: 0)
        let caller = try shards.attach(alice, slot: 1, at: 1)
        let callee = try (0..<5).map { try shards.attach(bob, "d\($0)", slot: UInt32($0 + 2), at: 1) }
        let invite = shards.states[0].invite(callID: "c1", callee: bob, offer: [1], from: caller, now: TwoShards.at(2), into: &effects)
        // The invite's step rings the first chunk; the rest wait in a step of their own.
        var pending = shards.states[1].handle(try #require(invite.next.first), now: TwoShards.at(2), into: &effects).next
        #expect(callee.filter { !TwoShards.events($0).isEmpty }.count == 2)
        #expect(forget(bob, &shards) == 5)
        while !pending.isEmpty {
            pending += shards.states[ShardMap.shard(of: pending[0].user, count: 2)].handle(pending.removeFirst(), now: TwoShards.at(3), into: &effects).next
        }
        #expect(TwoShards.isCallEnded(TwoShards.events(caller).last, .peerDisconnected, peer: bob))
        #expect(shards.states[1].counters.pendingEvents == 0, "a forgotten device was rung")
        expectGone(shards, caller: caller)
    }

    @Test("the callee forgotten while its only device, offline, is being woken by push: peerDisconnected at once")
    func calleeForgottenWhileWaking() throws {
        var effects: [SwitchboardEffect] = []
        var shards = TwoShards()
        shards.states[1].pushRouting = PushRouting(services: [.webhook])
        let alice = TwoShards.user("alice", onShard: 0)
        let caller = try shards.attach(alice, slot: 1, at: 1)
        let phone = try shards.attach(bob, "phone", slot: 2, at: 1)
        #expect((try? shards.states[1].registerPush(PushRegistration(platform: "fcm", token: [1]), for: phone).get()) != nil)
        shards.states[1].detach(phone, connection: phone.connection!, now: TwoShards.at(1.5))
        let invited = shards.request(alice, at: 2) { $0.invite(callID: "c1", callee: bob, offer: [1], from: caller, now: TwoShards.at(2), into: &effects) }
        #expect(TwoShards.isOK(invited))
        #expect(shards.states[1].calls["c1"] != nil, "the call waits for the woken device")
        #expect(forget(bob, &shards) == 1)
        #expect(TwoShards.isCallEnded(TwoShards.events(caller).last, .peerDisconnected, peer: bob))
        expectGone(shards, caller: caller)
    }

    @Test("the caller forgotten while the callee's devices ring: each rung device hears peerDisconnected at once", arguments: [0, 1])
    func callerForgottenWhileRinging(callerShard: Int) throws {
        var shards = TwoShards()
        let (caller, callee) = try call(&shards, callerShard: callerShard)
        #expect(forget(caller.userID, &shards) == 1)
        for device in callee {
            #expect(TwoShards.isCallEnded(TwoShards.events(device).last, .peerDisconnected, peer: caller.userID))
        }
        expectGone(shards, caller: caller)
    }

    @Test("an answered call: forgetting either party ends it at once for the other with peerDisconnected", arguments: [0, 1], [false, true])
    func answeredCallForgotten(callerShard: Int, forgetCaller: Bool) throws {
        var effects: [SwitchboardEffect] = []
        var shards = TwoShards()
        let (caller, callee) = try call(&shards, callerShard: callerShard)
        #expect(TwoShards.isOK(shards.request(bob, at: 2.5) { $0.accept(callID: "c1", answer: [2], from: callee[1], into: &effects) }))
        if forgetCaller {
            #expect(forget(caller.userID, &shards) == 1)
            #expect(TwoShards.isCallEnded(TwoShards.events(callee[1]).last, .peerDisconnected, peer: caller.userID))
        } else {
            #expect(forget(bob, &shards) == 2)
            #expect(TwoShards.isCallEnded(TwoShards.events(caller).last, .peerDisconnected, peer: bob))
        }
        expectGone(shards, caller: caller)
    }
}
