import CLinuxShims
import SignalingProtocol
import SignalingSupport
import Testing
@testable import SignalingServer
#if canImport(Glibc)
import Glibc
#endif

/// Every deadline is checked "just before" (must not have fired) and "just after" (must
/// have fired), with the event that starts it placed late in a second (x.9 s): a deadline
/// kept in whole seconds from a stamp rounded down fired up to a second early there.
/// Short deadlines are exact; the long ones (session and device expiry, idle timeout),
/// kept in seconds, may fire up to a second late, never early.
@Suite("Deadlines never fire early (routing core, pure)")
struct SwitchboardDeadlineTests {
    let epoch = Instant(nanoseconds: 1_000_000_000_000)

    func at(_ seconds: Double) -> Instant { epoch + .milliseconds(Int64((seconds * 1000).rounded())) }

    func makeState(_ configure: (inout SwitchboardConfiguration) -> Void = { _ in }) -> SwitchboardState {
        var configuration = SwitchboardConfiguration()
        configure(&configuration)
        return SwitchboardState(configuration: configuration, epoch: epoch)
    }

    func connection(_ slot: UInt32) -> ConnectionRef { ConnectionRef(loop: 0, slot: slot, generation: 1) }

    func attach(
        _ state: inout SwitchboardState, _ user: String, slot: UInt32, resume: ResumePoint? = nil, at seconds: Double
    ) throws -> AttachGrant {
        var effects: [SwitchboardEffect] = []
        return try state.attach(userID: user, deviceID: "d1", resume: resume, connection: connection(slot), now: at(seconds), into: &effects).get()
    }

    /// alice calls bob, bob answers; both connected at second 1.
    func activeCall(_ state: inout SwitchboardState) throws -> (alice: DeviceRecord, bob: AttachGrant) {
        var effects: [SwitchboardEffect] = []
        let alice = try attach(&state, "alice", slot: 1, at: 1).record
        let bob = try attach(&state, "bob", slot: 2, at: 1)
        _ = state.invite(callID: "c1", callee: "bob", offer: [], from: alice, now: at(1), into: &effects)
        _ = state.accept(callID: "c1", answer: [], from: bob.record, into: &effects)
        #expect(state.calls["c1"] != nil)
        return (alice, bob)
    }

    /// Runs `expire` every 250 ms (the default tick) from `from` through `through`.
    func tick(_ state: inout SwitchboardState, from: Double, through: Double) {
        var effects: [SwitchboardEffect] = []
        var time = from
        while time <= through + 1e-9 {
            state.expire(now: at(time), into: &effects)
            time += 0.25
        }
        state.expire(now: at(through), into: &effects)
    }

    @Test("call grace: a party lost at x.9 s is given up no earlier than the grace, and right after it")
    func callGraceExact() throws {
        var effects: [SwitchboardEffect] = []
        var state = makeState { $0.callGrace = .seconds(2) }
        let (_, bob) = try activeCall(&state)
        state.detach(bob.record, connection: connection(2), now: at(100.9))
        tick(&state, from: 100.9, through: 102.899)
        #expect(state.calls["c1"] != nil, "the call ended before its 2 s grace")
        state.expire(now: at(102.901), into: &effects)
        #expect(state.calls["c1"] == nil, "the call outlived its grace")
    }

    @Test("call grace: a resume 1.5 s into a 2 s grace keeps the call (loss at x.9 s)")
    func resumeWithinGraceLateInSecond() throws {
        var state = makeState { $0.callGrace = .seconds(2) }
        let (_, bob) = try activeCall(&state)
        state.detach(bob.record, connection: connection(2), now: at(100.9))
        tick(&state, from: 100.9, through: 102.4)
        _ = try attach(&state, "bob", slot: 3, resume: ResumePoint(sessionID: bob.sessionID, lastReceivedSeq: 0), at: 102.4)
        tick(&state, from: 102.4, through: 120)
        #expect(state.calls["c1"] != nil, "the resumed party lost its call")
    }

    @Test("call grace: the check of an earlier loss does not act on a later loss in the same second")
    func graceCheckOfEarlierLoss() throws {
        var effects: [SwitchboardEffect] = []
        var state = makeState { $0.callGrace = .seconds(2) }
        let (_, bob) = try activeCall(&state)
        state.detach(bob.record, connection: connection(2), now: at(100.1))
        let again = try attach(&state, "bob", slot: 3, resume: ResumePoint(sessionID: bob.sessionID, lastReceivedSeq: 0), at: 100.2)
        state.detach(again.record, connection: connection(3), now: at(100.9))
        tick(&state, from: 100.9, through: 102.899)
        #expect(state.calls["c1"] != nil, "the first loss's grace ended the call 0.8 s early")
        state.expire(now: at(102.901), into: &effects)
        #expect(state.calls["c1"] == nil)
    }

    @Test("session expiry: not before the TTL after a loss at x.9 s, within a second after it")
    func sessionExpiry() throws {
        var state = makeState { $0.sessionTTL = .seconds(100) }
        let grant = try attach(&state, "bob", slot: 1, at: 1)
        state.detach(grant.record, connection: connection(1), now: at(10.9))
        tick(&state, from: 10.9, through: 110.899)
        #expect(state.counters.sessionsExpired == 0, "the session expired early")
        #expect(grant.record.sessionID == grant.sessionID)
        tick(&state, from: 110.9, through: 111.9)
        #expect(state.counters.sessionsExpired == 1, "the session outlived its TTL by more than a second")
        #expect(grant.record.sessionID != grant.sessionID)
    }

    @Test("device expiry: not before the event TTL after a loss at x.9 s, within a second after it")
    func deviceExpiry() throws {
        var state = makeState { $0.sessionTTL = .seconds(50); $0.eventTTL = .seconds(100) }
        let grant = try attach(&state, "bob", slot: 1, at: 1)
        state.detach(grant.record, connection: connection(1), now: at(10.9))
        tick(&state, from: 10.9, through: 110.899)
        #expect(state.device("bob", "d1") === grant.record, "the device was forgotten early")
        tick(&state, from: 110.9, through: 111.9)
        #expect(state.device("bob", "d1") == nil, "the device outlived the event TTL by more than a second")
    }

    @Test("a device that reconnects often keeps one expiry entry each, and expires from its last loss")
    func expiryEntriesPerDevice() throws {
        var effects: [SwitchboardEffect] = []
        var state = makeState { $0.sessionTTL = .seconds(100); $0.eventTTL = .seconds(200) }
        var grant = try attach(&state, "bob", slot: 1, at: 1)
        var time = 1.0
        for cycle in 0..<1_000 {
            time += 0.05
            state.detach(grant.record, connection: connection(UInt32(cycle % 2 + 1)), now: at(time))
            time += 0.05
            grant = try attach(&state, "bob", slot: UInt32((cycle + 1) % 2 + 1), at: time)
            state.expire(now: at(time), into: &effects)
        }
        #expect(state.expiryEntryCount == 2)
        // The last loss, late in a second; the first entries come due long before it expires.
        let lastLoss = time + 0.85
        state.detach(grant.record, connection: connection(UInt32(1_000 % 2 + 1)), now: at(lastLoss))
        #expect(state.expiryEntryCount == 2)
        tick(&state, from: lastLoss, through: lastLoss + 99.999)
        #expect(state.counters.sessionsExpired == 0)
        tick(&state, from: lastLoss + 100, through: lastLoss + 101)
        #expect(state.counters.sessionsExpired == 1)
        tick(&state, from: lastLoss + 101, through: lastLoss + 199.999)
        #expect(state.device("bob", "d1") != nil)
        tick(&state, from: lastLoss + 200, through: lastLoss + 201)
        #expect(state.device("bob", "d1") == nil)
        #expect(state.expiryEntryCount == 0)
    }

    @Test("ring timeout: exact, from an invite at x.9 s")
    func ringTimeout() throws {
        var effects: [SwitchboardEffect] = []
        var state = makeState { $0.ringTimeout = .seconds(60) }
        let alice = try attach(&state, "alice", slot: 1, at: 1).record
        _ = try attach(&state, "bob", slot: 2, at: 1)
        _ = state.invite(callID: "c1", callee: "bob", offer: [], from: alice, now: at(10.9), into: &effects)
        tick(&state, from: 10.9, through: 70.899)
        #expect(state.calls["c1"] != nil, "the call stopped ringing early")
        state.expire(now: at(70.901), into: &effects)
        #expect(state.calls["c1"] == nil)
    }

    @Test("de-duplication window: exact, from a send at x.9 s")
    func dedupWindow() throws {
        var effects: [SwitchboardEffect] = []
        var state = makeState { $0.dedupWindow = .seconds(30) }
        let alice = try attach(&state, "alice", slot: 1, at: 1).record
        _ = try attach(&state, "bob", slot: 2, at: 1)
        let message = OutgoingMessage(messageID: "m1", recipient: "bob", contentType: "text/plain", body: [1])
        _ = try state.send(message, from: alice, now: at(10.9), into: &effects).get()
        tick(&state, from: 10.9, through: 40.899)
        #expect(try state.send(message, from: alice, now: at(40.899), into: &effects).get().event == nil, "forgotten before the window ended")
        #expect(state.counters.messagesDeduplicated == 1)
        state.expire(now: at(40.901), into: &effects)
        #expect(try state.send(message, from: alice, now: at(40.901), into: &effects).get().event != nil, "still remembered after the window")
    }

}

@Suite("Deadlines never fire early (real sockets, injected clock)")
struct ServerDeadlineTests {
    let offer = Array("v=0 offer".utf8)

    @Test("handshake timeout: a connection accepted at x.9 s is closed at its timeout, not before")
    func handshakeTimeoutLateInSecond() throws {
        let server = try TestServer()
        try server.advance(by: .milliseconds(900))
        let client = try server.client()
        try server.waitFor("the connection to be accepted") { $0.openConnections == 1 }
        try server.advance(by: .milliseconds(9_950))
        #expect(client.isOpenAndQuiet, "closed before the 10 s handshake timeout")
        try server.advance(by: .milliseconds(100))
        #expect(try client.expectClose().code == .handshakeTimeout)
    }

    @Test("idle timeout: a HELLO at x.9 s is closed after 1.5 × keep-alive, not before")
    func idleTimeoutLateInSecond() throws {
        let server = try TestServer()
        try server.advance(by: .milliseconds(900))
        let (client, welcome) = try server.connect(user: "alice")
        #expect(welcome.idleTimeoutSeconds == 900)
        try server.advance(by: .milliseconds(899_950))
        #expect(client.isOpenAndQuiet, "closed before the idle timeout")
        try server.advance(by: .milliseconds(1_100))
        #expect(try client.expectClose().code == .idleTimeout)
    }

    @Test("drain timeout: a drain begun at x.9 s waits the whole timeout for a client that stays")
    func drainTimeoutLateInSecond() throws {
        let server = try TestServer { $0.drainTimeout = .seconds(1) }
        let (client, _) = try server.connect(user: "alice")
        try server.advance(by: .milliseconds(900))
        server.server.beginShutdown()
        #expect(try client.expect("CLOSE") { frame -> Close? in if case .close(let close) = frame { return close }; return nil }.code == .goingAway)
        try server.advance(by: .milliseconds(950))
        #expect(server.server.isRunning, "the drain ended before its timeout")
        server.clock.advance(by: .milliseconds(1_100))
        try server.waitFor("the drain to end", { _ in !server.server.isRunning })
    }
}
