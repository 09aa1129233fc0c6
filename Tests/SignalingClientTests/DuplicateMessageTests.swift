import Foundation
import Testing
import SignalingProtocol
import SignalingSupport
@testable import SignalingClient

/// A message that comes a second time under a new sequence number (a server that delivers
/// before commit crashed, and the sender sent the message again) reaches the app once.
@Suite("Duplicate messages")
struct DuplicateMessageTests {
    func message(_ id: String, from sender: String) -> Event {
        .message(DeliveredMessage(messageID: id, sender: sender, senderDevice: "laptop", recipient: "alice",
                                  contentType: "text/plain", body: Array(id.utf8), serverTime: 5))
    }

    @Test("the second copy of a message is not handed to the app, and is acknowledged in turn")
    func secondCopyDropped() throws {
        let pair = try ConnectedPair()
        defer { pair.shutdown() }
        try pair.peer.sendEvent(seq: 1, message("m1", from: "bob"))
        try pair.peer.sendEvent(seq: 2, message("m1", from: "bob"))  // the copy
        try pair.peer.sendEvent(seq: 3, message("m1", from: "carol"))  // same id, another sender
        try pair.peer.sendEvent(seq: 4, message("m2", from: "bob"))

        let (ack, _) = try pair.peer.readUntil { $0 == .ack(seq: 4) }
        #expect(ack == .ack(seq: 4))
        let received = pair.recorder.all.compactMap { event -> String? in
            if case .messageReceived(let message) = event { return "\(message.sender)/\(message.messageID)" }
            return nil
        }
        #expect(received == ["bob/m1", "carol/m1", "bob/m2"])
    }

    @Test("the window of remembered ids is bounded: the oldest is forgotten first")
    func boundedWindow() {
        var recent = RecentMessageIDs(capacity: 3)
        let answers = ["1", "2", "3", "1", "4", "1", "4"].map { recent.insert(sender: "bob", messageID: $0) }
        // 1 is remembered until 4 evicts it; then it is new again, and 4 is remembered.
        #expect(answers == [true, true, true, false, true, true, false])
    }
}
