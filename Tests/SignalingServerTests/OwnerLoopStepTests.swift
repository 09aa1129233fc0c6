import SignalingProtocol
@testable import SignalingServer
import Testing

/// Shards owned by their loops (docs/ARCHITECTURE.md, "Routing shards"): shard i is loop
/// i's, and a step of an operation that spans users runs on the loop that owns its user's
/// shard, handed over through that loop's inbox, whichever loop the request came in on.
/// Two embedded loops (`EmbeddedServer`): what each loop ran is counted
/// (`LoopMetrics.stepsRun`), and debug builds check that a loop runs steps of its own
/// shard only (`Switchboard.drive`).
@Suite("Steps run on their shard's owner loop (embedded loops)")
struct OwnerLoopStepTests {
    let offer = Array("v=0 offer".utf8)
    let answer = Array("v=0 answer".utf8)

    /// A user id starting with `prefix` that shard `shard` of 2 holds.
    func user(_ prefix: String, onShard shard: Int) -> String {
        (0...).lazy.map { "\(prefix)\($0)" }.first { ShardMap.shard(of: $0, count: 2) == shard }!
    }

    /// Steps each loop has run so far.
    func stepsRun(_ server: EmbeddedServer) -> [UInt64] { server.loops.map { $0.metrics.stepsRun.value } }

    @Test("a message from a device on loop 0 to a user of shard 1: loop 1 queues it (deliverMessage), loop 0 settles the sender's side; OK, delivery and receipt as before")
    func messageStepsRunOnOwners() throws {
        let server = try EmbeddedServer()
        let alice = user("alice", onShard: 0), bob = user("bob", onShard: 1)
        let (sender, _) = try server.connect(user: alice, loop: 0)
        // bob's device on loop 0 too: the event queued by loop 1 crosses back to it.
        let (recipient, _) = try server.connect(user: bob, loop: 0)
        let before = stepsRun(server)
        #expect(try sender.request(1, .identifiedMessage("m1", to: bob)).isOK)
        let after = stepsRun(server)
        #expect(after[1] - before[1] == 1, "bob's shard's step ran on loop \(after[1] == before[1] ? 0 : 1)")
        #expect(after[0] - before[0] == 1, "the settle step for alice's shard")
        #expect(server.loops[0].metrics.stepsPosted.value == 1)
        #expect(server.loops[1].metrics.stepsPosted.value == 1)
        let (seq, event) = try recipient.nextEvent()
        guard case .message(let message) = event else { Issue.record("not a message: \(event)"); return }
        #expect(message.messageID == "m1" && message.sender == alice)
        // The receipt: a step of alice's shard, run by its owner, loop 0.
        try recipient.ack(seq)
        guard case .messageDelivered(let delivered, _, _, _) = try sender.nextEvent().event else { Issue.record("no receipt"); return }
        #expect(delivered == "m1")
        #expect(stepsRun(server)[0] - after[0] == 1)
    }

    @Test("a refusal decided on the recipient's loop reaches the sender on the other loop, and frees the message id")
    func refusalFromOwner() throws {
        let server = try EmbeddedServer { $0.maxPendingEvents = 1 }
        let alice = user("alice", onShard: 0), bob = user("bob", onShard: 1)
        let (sender, _) = try server.connect(user: alice, loop: 0)
        let (recipient, _) = try server.connect(user: bob, loop: 1)
        #expect(try sender.request(1, .identifiedMessage("m1", to: bob)).isOK)
        #expect(try sender.request(2, .identifiedMessage("m2", to: bob)).errorCode == .recipientBacklogFull)
        let (seq, _) = try recipient.nextEvent()
        try recipient.ack(seq)
        _ = try sender.nextEvent()  // m1's receipt
        // Refused means nothing changed: the same id is a new message now.
        #expect(try sender.request(3, .identifiedMessage("m2", to: bob)).isOK)
        guard case .message(let message) = try recipient.nextEvent().event else { Issue.record("m2 not delivered"); return }
        #expect(message.messageID == "m2")
    }

    @Test("a call across shards: the callee's shard's loop answers the invite, the OK comes before CALL_RANG; the first accept wins on the callee's loop, the other device hears answeredElsewhere; hang-up")
    func callAcrossShards() throws {
        let server = try EmbeddedServer()
        let alice = user("alice", onShard: 0), bob = user("bob", onShard: 1)
        let (caller, _) = try server.connect(user: alice, loop: 0)
        let (phone, _) = try server.connect(user: bob, device: "phone", loop: 0)
        let (tablet, _) = try server.connect(user: bob, device: "tablet", loop: 1)
        let before = stepsRun(server)
        try caller.send(.request(id: 1, .callInvite(callID: "c1", callee: bob, offer: offer)))
        #expect(stepsRun(server)[1] - before[1] == 1, "the invite ran on bob's shard's loop")
        guard case .callIncoming = try phone.nextEvent().event, case .callIncoming = try tablet.nextEvent().event else {
            Issue.record("not every device rang"); return
        }
        #expect(try phone.request(1, .callRinging(callID: "c1")).isOK)
        // In the order written: the invite's OK, then CALL_RANG.
        #expect(try caller.next()?.isOK == true)
        guard case .event(_, .callRang("c1", "phone")) = try caller.next() else { Issue.record("no CALL_RANG after the OK"); return }
        #expect(try tablet.request(1, .callAccept(callID: "c1", answer: answer)).isOK)
        #expect(try caller.nextEvent().event == .callAccepted(callID: "c1", device: "tablet", answer: answer))
        guard case .callEnded("c1", .answeredElsewhere, _, _) = try phone.nextEvent().event else {
            Issue.record("the other device was not told"); return
        }
        #expect(try phone.request(2, .callAccept(callID: "c1", answer: answer)).errorCode == .illegalCallTransition)
        #expect(try caller.request(2, .callHangup(callID: "c1")).isOK)
        guard case .callEnded("c1", .hungUp, _, _) = try tablet.nextEvent().event else { Issue.record("hang-up not told"); return }
        #expect(try tablet.request(2, .callHangup(callID: "c1")).errorCode == .unknownCall)
    }

    @Test("a caller cancels a call to another shard's user: the callee's loop decides and answers")
    func cancelAcrossShards() throws {
        let server = try EmbeddedServer()
        let alice = user("alice", onShard: 0), bob = user("bob", onShard: 1)
        let (caller, _) = try server.connect(user: alice, loop: 0)
        let (callee, _) = try server.connect(user: bob, loop: 0)
        #expect(try caller.request(1, .callInvite(callID: "c1", callee: bob, offer: offer)).isOK)
        _ = try callee.nextEvent()
        let before = stepsRun(server)
        #expect(try caller.request(2, .callCancel(callID: "c1")).isOK)
        #expect(stepsRun(server)[1] - before[1] == 1)
        guard case .callEnded("c1", .cancelled, _, _) = try callee.nextEvent().event else { Issue.record("callee not told"); return }
        #expect(try callee.request(1, .callAccept(callID: "c1", answer: answer)).errorCode == .unknownCall)
        // The caller's shard forgot the call too: the id is free for a new call.
        #expect(try caller.request(3, .callInvite(callID: "c1", callee: bob, offer: offer)).isOK)
    }

    @Test("a ring timeout across shards: the callee's loop times it out, the caller's loop tells the caller")
    func ringTimeoutAcrossShards() throws {
        let server = try EmbeddedServer()
        let alice = user("alice", onShard: 1), bob = user("bob", onShard: 0)
        let (caller, _) = try server.connect(user: alice, loop: 0)
        let (callee, _) = try server.connect(user: bob, loop: 1)
        #expect(try caller.request(1, .callInvite(callID: "c1", callee: bob, offer: offer)).isOK)
        _ = try callee.nextEvent()
        server.advance(by: .seconds(59))
        #expect(caller.staysSilent)
        let before = stepsRun(server)
        server.advance(by: .seconds(2))
        // The event for the caller and the notice that the call is closed: alice's shard's.
        #expect(stepsRun(server)[1] - before[1] == 2, "the caller's notices ran on alice's shard's loop")
        #expect(stepsRun(server)[0] == before[0])
        guard case .callEnded("c1", .noAnswer, _, _) = try caller.nextEvent().event else { Issue.record("caller not told"); return }
        guard case .callEnded("c1", .noAnswer, _, _) = try callee.nextEvent().event else { Issue.record("callee not told"); return }
    }

    @Test("a reply waiting in a loop's inbox goes out before an event the loop then writes to the same connection")
    func replyBeforeRoutedEvent() throws {
        let server = try EmbeddedServer()
        // One shard for both users: both live on loop 0, and bob's message is one hold
        // there, which queues alice's event.
        let alice = user("alice", onShard: 0), bob = user("bob", onShard: 0)
        let (recipient, _) = try server.connect(user: alice, loop: 1)
        let (sender, _) = try server.connect(user: bob, loop: 0)
        #expect(recipient.loop == 0)
        // As a step of another loop answers a request of alice's connection.
        let ref = server.loops[0].ownership.withLock { _ in server.loops[0].reference(recipient.socket.slot) }
        server.loops[0].post(.reply(ref, .ok(requestID: 99, serverTime: 1)))
        #expect(try sender.request(1, .identifiedMessage("m1", to: alice)).isOK)
        guard case .ok(99, _)? = try recipient.next() else { Issue.record("the event overtook the reply"); return }
        guard case .event(_, .message)? = try recipient.next() else { Issue.record("no message"); return }
    }

    @Test("steps for a loop that has stopped (its inbox closed) are run by the loop that hands them on: the message is answered and queued for its recipient")
    func stoppedOwner() throws {
        let server = try EmbeddedServer()
        let alice = user("alice", onShard: 0), bob = user("bob", onShard: 1)
        let (sender, _) = try server.connect(user: alice, loop: 0)
        // Bob's device is known and away: a stopped loop has no connections.
        let (recipient, _) = try server.connect(user: bob, loop: 0)
        #expect(recipient.loop == 1)
        recipient.close()
        server.runUntilQuiet()
        server.loops[1].closeInbox()
        let before = stepsRun(server)
        #expect(try sender.request(1, .identifiedMessage("m1", to: bob)).isOK)
        #expect(stepsRun(server) == before, "no loop ran the steps as their owner")
        let pending = server.context.switchboard.withState(of: bob, wall: 0) { $0.counters.pendingEvents }
        #expect(pending == 1, "the message was not queued for bob's device")
    }
}
