import Foundation
import Testing
import SignalingProtocol
import SignalingSupport
@testable import SignalingClient

/// Reads `stream` until `enough` holds for what was read, or the stream ends; fails after
/// `timeout`.
func collect(_ stream: AsyncStream<ClientEvent>, within timeout: Duration = .seconds(15),
             until enough: @escaping @Sendable ([ClientEvent]) -> Bool = { _ in false }) async throws -> [ClientEvent] {
    try await withThrowingTaskGroup(of: [ClientEvent]?.self) { group in
        group.addTask {
            var events: [ClientEvent] = []
            for await event in stream {
                events.append(event)
                if enough(events) { break }
            }
            return events
        }
        group.addTask {
            try await Task.sleep(for: timeout)
            return nil
        }
        defer { group.cancelAll() }
        guard let events = try await group.next()!, !Task.isCancelled else { throw FixtureError("stream not done within \(timeout)") }
        return events
    }
}

private func messageIDs(_ events: [ClientEvent]) -> [String] {
    events.compactMap { if case .messageReceived(let message) = $0 { return message.messageID } else { return nil } }
}

@Suite("async/await: event streams, async connect and requests")
struct AsyncAPITests {
    @Test("every stream gets exactly what the handler gets, in the same order, and ends at shutdown")
    func streamsMatchHandler() async throws {
        let server = try RealServer()
        let bob = try TestClient(port: server.port, user: "bob", device: "phone")
        let first = bob.client.events()
        let second = bob.client.events()
        let alice = try SignalingClient(configuration: ClientConfiguration(host: "127.0.0.1", port: server.port, userID: "alice", deviceID: "laptop"))
        defer { alice.shutdown() }
        try await bob.client.connect(timeout: .seconds(5))
        try await alice.connect(timeout: .seconds(5))
        for index in 1...20 {
            try await alice.send(to: "bob", body: Array("\(index)".utf8), messageID: "m\(index)")
        }
        #expect(bob.recorder.wait { messageIDs($0).count == 20 })
        bob.client.shutdown()
        let (one, two) = (try await collect(first), try await collect(second))  // both end: shutdown finished them
        #expect(messageIDs(one) == (1...20).map { "m\($0)" })
        #expect(one == bob.recorder.all && two == one)
        #expect(one.last == .connectionStateChanged(.stopped(.shutDown)))
        let late = try await collect(bob.client.events())
        #expect(late.isEmpty, "a stream asked for after shutdown is already finished")
    }

    @Test("async connect, send and call requests on a client with no handler; refusals throw")
    func asyncRequests() async throws {
        let server = try RealServer()
        let alice = try SignalingClient(configuration: ClientConfiguration(host: "127.0.0.1", port: server.port, userID: "alice", deviceID: "laptop"))
        let bob = try SignalingClient(configuration: ClientConfiguration(host: "127.0.0.1", port: server.port, userID: "bob", deviceID: "phone"))
        defer { alice.shutdown(); bob.shutdown() }
        let aliceEvents = alice.events()
        let bobEvents = bob.events()
        let session = try await alice.connect(timeout: .seconds(5))
        #expect(session.keepAliveInterval == .seconds(600))
        try await bob.connect(timeout: .seconds(5))

        let sent = try await alice.send(to: "bob", body: Array("hello".utf8))
        #expect(!sent.messageID.isEmpty && sent.serverTime > 0)
        let received = try await collect(bobEvents) { messageIDs($0).count == 1 }
        #expect(messageIDs(received) == [sent.messageID])

        let callID = try await alice.invite(callee: "bob", offer: [1, 2])
        try await bob.sendRinging(callID: callID)
        try await bob.accept(callID: callID, answer: [3])
        let ringing = try await collect(aliceEvents) { $0.contains(.callAccepted(callID: callID, device: "phone", answer: [3])) }
        #expect(ringing.contains(.callRinging(callID: callID, device: "phone")))
        try await alice.hangUp(callID: callID)

        await #expect(throws: RequestError.invalidArgument("recipient must not be empty")) {
            try await alice.send(to: "", body: [1])
        }
        await #expect(throws: RequestError.self) { try await alice.accept(callID: "no-such-call", answer: []) }
        await #expect(throws: RequestError.invalidArgument("\"fcm\" names a push kind, not a webhook platform")) {
            try await alice.registerPush(kind: .webhook(platform: "fcm"), token: [1])
        }
        try await alice.registerPush(kind: .apnsVoIP, token: [1, 2, 3], environment: .sandbox, topic: "com.example.app")
    }

    @Test("async connect to a closed port throws the connect error")
    func asyncConnectFails() async throws {
        let port = try ReservedPort()
        let client = try SignalingClient(configuration: ClientConfiguration(host: "127.0.0.1", port: port.port, userID: "a", deviceID: "d"))
        defer { client.shutdown() }
        do {
            try await client.connect(timeout: .seconds(5))
            Issue.record("connected to a closed port")
        } catch {
            guard case .refused = error else { Issue.record("got \(error)"); return }
        }
    }
}
