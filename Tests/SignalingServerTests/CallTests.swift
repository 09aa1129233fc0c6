import SignalingProtocol
@testable import SignalingServer
import Testing

/// Alice (device d1) calls bob (call c1): invite, ringing, accept, hang-up by alice, each
/// step checked on the other side as it happens. Returns the invite's server time.
func playFullCall(from alice: some ProtocolClient, to bob: some ProtocolClient, offer: [UInt8], answer: [UInt8]) throws -> UInt64 {
    #expect(try alice.request(1, .callInvite(callID: "c1", callee: "bob", offer: offer)).isOK)
    let (inviteSeq, incoming) = try bob.nextEvent()
    guard case .callIncoming("c1", "alice", "d1", offer, let serverTime) = incoming else {
        throw TestClient.Failure("expected the call's invite, got \(incoming)")
    }
    try bob.ack(inviteSeq)

    #expect(try bob.request(1, .callRinging(callID: "c1")).isOK)
    #expect(try alice.nextEvent().event == .callRang(callID: "c1", device: "d1"))

    #expect(try bob.request(2, .callAccept(callID: "c1", answer: answer)).isOK)
    #expect(try alice.nextEvent().event == .callAccepted(callID: "c1", device: "d1", answer: answer))

    #expect(try alice.request(2, .callHangup(callID: "c1")).isOK)
    guard case .callEnded("c1", .hungUp, "alice", _) = try bob.nextEvent().event else {
        throw TestClient.Failure("bob did not learn of the hang-up")
    }
    return serverTime
}

@Suite("Calls over real sockets")
struct CallTests {
    let offer = Array("v=0 offer".utf8)
    let answer = Array("v=0 answer".utf8)

    @Test("invite, ringing, accept, hang-up: each step reaches the other side at once")
    func fullCall() throws {
        let server = try TestServer()
        let (alice, _) = try server.connect(user: "alice")
        let (bob, _) = try server.connect(user: "bob")
        let ringingSince = try playFullCall(from: alice, to: bob, offer: offer, answer: answer)
        #expect(ringingSince == server.clock.wallMilliseconds())
        // The call is gone: hanging up again is an error.
        #expect(try bob.request(3, .callHangup(callID: "c1")).errorCode == .unknownCall)
    }

    @Test("the caller disconnects mid-ring: after the grace period the callee is told")
    func callerDisconnects() throws {
        let server = try TestServer()
        let (bob, _) = try server.connect(user: "bob")
        do {
            let (alice, _) = try server.connect(user: "alice")
            _ = try alice.request(1, .callInvite(callID: "c1", callee: "bob", offer: offer))
        }
        _ = try bob.nextEvent()
        try server.waitFor("alice's disconnect") { $0.establishedConnections == 1 }
        try server.advance(by: .seconds(9))
        #expect(try bob.staysSilent(for: .milliseconds(20)))
        try server.advance(by: .seconds(2))
        guard case .callEnded("c1", .peerDisconnected, "alice", _) = try bob.nextEvent().event else {
            Issue.record("callee not told"); return
        }
    }
}

/// The calls' rules, over embedded loops (`EmbeddedServer`): the same loop and routing
/// code as over sockets, with no sockets, threads or waiting; "Calls over real sockets"
/// keeps the socket path covered.
@Suite("Calls (embedded loops)")
struct EmbeddedCallTests {
    let offer = Array("v=0 offer".utf8)
    let answer = Array("v=0 answer".utf8)

    @Test("nobody answers: ring timeout is a missed call for both sides")
    func ringTimeout() throws {
        let server = try EmbeddedServer()
        let (alice, _) = try server.connect(user: "alice")
        let (bob, _) = try server.connect(user: "bob")
        _ = try alice.request(1, .callInvite(callID: "c1", callee: "bob", offer: offer))
        _ = try bob.nextEvent()
        server.advance(by: .seconds(59))
        #expect(alice.staysSilent)
        server.advance(by: .seconds(2))
        guard case .callEnded("c1", .noAnswer, "bob", _) = try alice.nextEvent().event else {
            Issue.record("caller not told"); return
        }
        guard case .callEnded("c1", .noAnswer, "alice", _) = try bob.nextEvent().event else {
            Issue.record("callee not told of the missed call"); return
        }
    }

    @Test("the callee hangs up an active call")
    func calleeHangsUp() throws {
        let server = try EmbeddedServer()
        let (alice, _) = try server.connect(user: "alice")
        let (bob, _) = try server.connect(user: "bob")
        _ = try alice.request(1, .callInvite(callID: "c1", callee: "bob", offer: offer))
        _ = try bob.nextEvent()
        _ = try bob.request(1, .callAccept(callID: "c1", answer: answer))
        _ = try alice.nextEvent()
        #expect(try bob.request(2, .callHangup(callID: "c1")).isOK)
        guard case .callEnded("c1", .hungUp, "bob", _) = try alice.nextEvent().event else {
            Issue.record("alice did not learn of the hang-up"); return
        }
    }

    @Test("reject as busy and as declined", arguments: [CallEndReason.busy, .declined])
    func reject(reason: CallEndReason) throws {
        let server = try EmbeddedServer()
        let (alice, _) = try server.connect(user: "alice")
        let (bob, _) = try server.connect(user: "bob")
        _ = try alice.request(1, .callInvite(callID: "c1", callee: "bob", offer: offer))
        _ = try bob.nextEvent()
        #expect(try bob.request(1, .callReject(callID: "c1", reason: reason)).isOK)
        guard case .callEnded("c1", let got, "bob", _) = try alice.nextEvent().event else {
            Issue.record("no CALL_ENDED"); return
        }
        #expect(got == reason)
    }

    @Test("the caller cancels before an answer")
    func cancel() throws {
        let server = try EmbeddedServer()
        let (alice, _) = try server.connect(user: "alice")
        let (bob, _) = try server.connect(user: "bob")
        _ = try alice.request(1, .callInvite(callID: "c1", callee: "bob", offer: offer))
        _ = try bob.nextEvent()
        #expect(try alice.request(2, .callCancel(callID: "c1")).isOK)
        guard case .callEnded("c1", .cancelled, "alice", _) = try bob.nextEvent().event else {
            Issue.record("no cancel"); return
        }
        #expect(try bob.request(1, .callAccept(callID: "c1", answer: answer)).errorCode == .unknownCall)
    }

    @Test("a callee with no connected device is unreachable at once")
    func calleeOffline() throws {
        let server = try EmbeddedServer()
        let (alice, _) = try server.connect(user: "alice")
        #expect(try alice.request(1, .callInvite(callID: "c1", callee: "nobody", offer: offer)).isOK)
        guard case .callEnded("c1", .unreachable, "nobody", _) = try alice.nextEvent().event else {
            Issue.record("no unreachable"); return
        }
        // A known user whose device went away is unreachable too.
        do {
            let (bob, _) = try server.connect(user: "bob")
            _ = bob
        }
        #expect(server.statistics.establishedConnections == 1)
        _ = try alice.request(2, .callInvite(callID: "c2", callee: "bob", offer: offer))
        guard case .callEnded("c2", .unreachable, "bob", _) = try alice.nextEvent().event else {
            Issue.record("no unreachable for an offline device"); return
        }
    }

    @Test("two devices of the callee: both ring, the first accept wins, the other is told")
    func twoDevices() throws {
        let server = try EmbeddedServer()
        let (alice, _) = try server.connect(user: "alice")
        let (phone, _) = try server.connect(user: "bob", device: "phone")
        let (tablet, _) = try server.connect(user: "bob", device: "tablet")
        _ = try alice.request(1, .callInvite(callID: "c1", callee: "bob", offer: offer))
        guard case .callIncoming = try phone.nextEvent().event, case .callIncoming = try tablet.nextEvent().event else {
            Issue.record("not every device rang"); return
        }
        #expect(try tablet.request(1, .callAccept(callID: "c1", answer: answer)).isOK)
        #expect(try alice.nextEvent().event == .callAccepted(callID: "c1", device: "tablet", answer: answer))
        guard case .callEnded("c1", .answeredElsewhere, "alice", _) = try phone.nextEvent().event else {
            Issue.record("the other device was not told"); return
        }
        // The late accept from the phone is refused and changes nothing.
        #expect(try phone.request(1, .callAccept(callID: "c1", answer: answer)).errorCode == .illegalCallTransition)
        #expect(try phone.request(2, .callHangup(callID: "c1")).errorCode == .notCallParticipant)
        #expect(try alice.request(2, .callHangup(callID: "c1")).isOK)
        guard case .callEnded("c1", .hungUp, _, _) = try tablet.nextEvent().event else {
            Issue.record("answering device not told"); return
        }
    }

    @Test("illegal steps get an error and change nothing")
    func illegalSteps() throws {
        let server = try EmbeddedServer()
        let (alice, _) = try server.connect(user: "alice")
        let (bob, _) = try server.connect(user: "bob")
        let (mallory, _) = try server.connect(user: "mallory")
        #expect(try bob.request(1, .callAccept(callID: "nope", answer: [])).errorCode == .unknownCall)
        #expect(try alice.request(1, .callInvite(callID: "self", callee: "alice", offer: [])).errorCode == .cannotCallSelf)

        _ = try alice.request(2, .callInvite(callID: "c1", callee: "bob", offer: offer))
        _ = try bob.nextEvent()
        #expect(try mallory.request(1, .callHangup(callID: "c1")).errorCode == .notCallParticipant)
        #expect(try mallory.request(2, .callAccept(callID: "c1", answer: [])).errorCode == .notCallParticipant)
        #expect(try mallory.request(3, .callInvite(callID: "c1", callee: "bob", offer: [])).errorCode == .callIdInUse)
        #expect(try bob.request(1, .callCancel(callID: "c1")).errorCode == .notCallParticipant)
        #expect(try alice.request(3, .callHangup(callID: "c1")).errorCode == .illegalCallTransition)
        // Still ringing: the callee can answer normally.
        #expect(try bob.request(2, .callAccept(callID: "c1", answer: answer)).isOK)
        #expect(try alice.nextEvent().event == .callAccepted(callID: "c1", device: "d1", answer: answer))
        #expect(try bob.request(3, .callAccept(callID: "c1", answer: answer)).errorCode == .illegalCallTransition)
        #expect(try alice.request(4, .callCancel(callID: "c1")).errorCode == .illegalCallTransition)
    }

    @Test("a party that resumes within the grace period keeps the call")
    func resumeWithinGrace() throws {
        let server = try EmbeddedServer()
        let (alice, bobWelcome) = try server.answeredCallThenCalleeLost(offer: offer, answer: answer)
        server.advance(by: .seconds(5))
        let bob = try server.client()
        _ = try bob.hello(user: "bob", resume: ResumePoint(sessionID: bobWelcome.sessionID, lastReceivedSeq: 1))
        server.advance(by: .seconds(10))
        #expect(alice.staysSilent)
        #expect(try bob.request(2, .callHangup(callID: "c1")).isOK)
        guard case .callEnded("c1", .hungUp, "bob", _) = try alice.nextEvent().event else {
            Issue.record("hang-up after resume not delivered"); return
        }
    }

    @Test("a callee device that connects while the call rings is rung too")
    func lateDeviceRings() throws {
        let server = try EmbeddedServer()
        let (alice, _) = try server.connect(user: "alice")
        let (phone, _) = try server.connect(user: "bob", device: "phone")
        _ = try alice.request(1, .callInvite(callID: "c1", callee: "bob", offer: offer))
        _ = try phone.nextEvent()
        let (laptop, _) = try server.connect(user: "bob", device: "laptop")
        guard case .callIncoming("c1", "alice", _, _, _) = try laptop.nextEvent().event else {
            Issue.record("late device not rung"); return
        }
    }
}

@Suite("Call invite retries (embedded loops)")
struct CallInviteRetryTests {
    @Test("an invite repeated by the same device is a retry: OK, and the callee rings once")
    func retriedInvite() throws {
        let server = try EmbeddedServer()
        let (alice, _) = try server.connect(user: "alice")
        let (bob, _) = try server.connect(user: "bob")
        #expect(try alice.request(1, .callInvite(callID: "c1", callee: "bob", offer: [1])).isOK)
        #expect(try alice.request(2, .callInvite(callID: "c1", callee: "bob", offer: [1])).isOK)
        guard case .callIncoming = try bob.nextEvent().event else { Issue.record("no ring"); return }
        #expect(bob.staysSilent)
        // Another device reusing the id is refused.
        let (tablet, _) = try server.connect(user: "alice", device: "tablet")
        #expect(try tablet.request(1, .callInvite(callID: "c1", callee: "bob", offer: [])).errorCode == .callIdInUse)
    }
}

extension EmbeddedServer {
    /// alice calls bob ("c1"), bob answers, then bob's connection is lost (`beforeLoss`
    /// runs just before). Returns alice's client, and bob's WELCOME for his resume.
    func answeredCallThenCalleeLost(
        offer: [UInt8], answer: [UInt8], beforeLoss: () -> Void = {}
    ) throws -> (alice: EmbeddedClient, bobWelcome: Welcome) {
        let (alice, _) = try connect(user: "alice")
        let (bob, welcome) = try connect(user: "bob")
        _ = try alice.request(1, .callInvite(callID: "c1", callee: "bob", offer: offer))
        let (seq, _) = try bob.nextEvent()
        try bob.ack(seq)
        _ = try bob.request(1, .callAccept(callID: "c1", answer: answer))
        _ = try alice.nextEvent()
        beforeLoss()
        bob.close()
        guard statistics.establishedConnections == 1 else { throw TestClient.Failure("bob's loss was not seen") }
        return (alice, welcome)
    }
}
