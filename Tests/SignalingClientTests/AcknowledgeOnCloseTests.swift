import Foundation
import Testing
import SignalingProtocol
import SignalingSupport
@testable import SignalingClient

/// A program that processes an event and then shuts the client down at once (a
/// command-line tool that exits after its work, like voipclient) must not leave the event
/// unacknowledged: the server would hand it to the next process of the same device.
@Suite("Acknowledgement when the app closes")
struct AcknowledgeOnCloseTests {
    enum Ending: String, CaseIterable { case shutdown, disconnect }

    @Test("an event processed just before shutdown or disconnect is acknowledged before the socket closes",
          arguments: Ending.allCases)
    func processedEventIsAcknowledged(ending: Ending) throws {
        let pair = try ConnectedPair()
        defer { pair.shutdown() }
        let isMessage: (ClientEvent) -> Bool = { if case .messageReceived = $0 { return true } else { return false } }
        let gate = pair.recorder.holdNext(where: isMessage)
        let message = DeliveredMessage(messageID: "m1", sender: "bob", senderDevice: "laptop", recipient: "alice",
                                       contentType: "text/plain", body: [1], serverTime: 5)
        try pair.peer.sendEvent(seq: 1, .message(message))
        #expect(pair.recorder.wait { $0.contains(where: isMessage) })

        // Order the client's queue deterministically: the app's handler returns (which
        // queues "processed"), then the app closes before the batched ACK had its turn.
        let core = pair.core
        core.queue.suspend()
        gate.signal()
        pair.test.eventQueue.sync {}
        switch ending {
        case .shutdown: core.queue.async { core.shutdown() }
        case .disconnect: core.queue.async { core.disconnect() }
        }
        core.queue.resume()

        let frames = try pair.peer.waitForClose()
        #expect(frames == [.ack(seq: 1)], "frames before the close: \(frames)")
    }

    @Test("shutdown returns once the connection has written what was queued and closed its socket")
    func shutdownWaitsForTheSocket() throws {
        let pair = try ConnectedPair()
        defer { pair.shutdown() }
        let connection = try #require(pair.core.queue.sync { pair.core.currentConnection })
        pair.client.shutdown()
        #expect(connection.waitUntilEnded(timeout: .zero), "the I/O thread was still running when shutdown returned")
        #expect(try pair.peer.waitForClose() == [])
    }
}
