import SignalingProtocol
@testable import SignalingServer
import SignalingStore
import TestSupport
import Testing

/// A user with more devices than one hold serves (`SwitchboardState.fanOutChunk`, 128): the
/// ring, the call's ending, the synced copies and the receipts reach every device a chunk
/// per hold (routing-core suites: "Ringing…", "A call's ending…", "Receipts…"). Here the
/// same over real sockets, two loops and a store, each device reading its own socket: what
/// a real client of a user with 300 devices sees, in PROTOCOL.md's order.
@Suite("A user with 300 devices over real sockets (more than one chunk per hold)")
struct ManyDevicesTests {
    static let devices = 300
    let alice = TwoShards.user("alice", onShard: 0)
    let bob = TwoShards.user("bob", onShard: 1)

    @Test("a call rings all 300 of the callee's devices; one accepts; the caller gets CALL_ACCEPTED and each of the other 299 CALL_ENDED answeredElsewhere, after its own CALL_INCOMING")
    func ringAndAnswerElsewhere() throws {
        let server = try TestServer(store: ModelEventStore())
        let (caller, _) = try server.connect(user: alice)
        let callee = try (0..<Self.devices).map { try server.connect(user: bob, device: "d\($0)").0 }
        #expect(try caller.request(1, .callInvite(callID: "c1", callee: bob, offer: [1])).isOK)
        for (index, device) in callee.enumerated() {
            let (seq, event) = try device.nextEvent()
            guard case .callIncoming("c1", alice, "d1", [1], _) = event else {
                Issue.record("d\(index): expected the invite, got \(event)"); return
            }
            try device.ack(seq)
        }
        let answering = Self.devices / 2
        #expect(try callee[answering].request(1, .callAccept(callID: "c1", answer: [2])).isOK)
        #expect(try caller.nextEvent().event == .callAccepted(callID: "c1", device: "d\(answering)", answer: [2]))
        for (index, device) in callee.enumerated() where index != answering {
            guard case .callEnded("c1", .answeredElsewhere, _, _) = try device.nextEvent().event else {
                Issue.record("d\(index) was not told answeredElsewhere"); return
            }
        }
        #expect(try callee[answering].staysSilent(for: .milliseconds(30)), "the answering device was told it was answered elsewhere")
    }

    @Test("a message from one of 300 devices: OK, the recipient's copy, a synced copy on each of the 299 others; the recipient's ACK brings MESSAGE_DELIVERED to all 300, each after its copy")
    func syncedCopiesAndReceipts() throws {
        let server = try TestServer(store: ModelEventStore())
        let senders = try (0..<Self.devices).map { try server.connect(user: alice, device: "d\($0)").0 }
        let (recipient, _) = try server.connect(user: bob)
        let sending = senders[0]
        let reply = try sending.request(1, .identifiedMessage("m1", to: bob))
        #expect(reply.isOK, "\(reply)")
        let (seq, event) = try recipient.nextEvent()
        guard case .message(let message) = event, message.messageID == "m1", message.senderDevice == "d0" else {
            Issue.record("the recipient got \(event)"); return
        }
        for (index, device) in senders.enumerated().dropFirst() {
            let (copySeq, copy) = try device.nextEvent()
            guard case .message(let synced) = copy, synced.messageID == "m1", synced.sender == alice, synced.recipient == bob else {
                Issue.record("d\(index): expected the synced copy, got \(copy)"); return
            }
            // A synced copy's ACK makes no receipt (PROTOCOL.md, section 5).
            try device.ack(copySeq)
        }
        try recipient.ack(seq)
        for (index, device) in senders.enumerated() {
            guard case .messageDelivered("m1", bob, "d1", _) = try device.nextEvent().event else {
                Issue.record("d\(index) got no delivery receipt"); return
            }
        }
        for (index, device) in senders.enumerated() {
            #expect(try device.staysSilent(for: .milliseconds(1)), "d\(index) got a second receipt (or one for a synced copy's ACK)")
        }
    }
}
