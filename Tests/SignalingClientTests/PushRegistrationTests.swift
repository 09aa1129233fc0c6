import Foundation
import Testing
import SignalingProtocol
import SignalingSupport
@testable import SignalingClient

@Suite("Push registration: kinds, environment and topic, re-sent on a fresh session")
struct PushRegistrationTests {
    /// Reads the next PUSH_REGISTER and answers OK; returns the request.
    private func acceptRegistration(_ peer: PeerConnection) throws -> Request {
        let (frame, skipped) = try peer.readUntil { if case .request(_, .pushRegister) = $0 { return true } else { return false } }
        #expect(skipped.allSatisfy { $0 == .ping || $0 == .pong || $0.type == .ack }, "unexpected \(skipped)")
        guard case .request(let id, let request) = frame else { throw FixtureError("not a request") }
        try peer.send(.ok(requestID: id, serverTime: 1))
        return request
    }

    @Test("each kind goes out under its platform name; environment and topic only when given")
    func kindsOnTheWire() throws {
        let pair = try ConnectedPair()
        defer { pair.shutdown() }
        let voip = AsyncValue<Result<RequestAcceptance, RequestError>>()
        pair.client.registerPush(kind: .apnsVoIP, token: [0xDE, 0xAD], environment: .sandbox, topic: "com.example.app") {
            voip.set(.success($0))
        }
        #expect(try acceptRegistration(pair.peer) == .pushRegister(
            platform: "apns-voip", token: [0xDE, 0xAD], environment: "sandbox", topic: "com.example.app"))
        #expect(try voip.value().isSuccess)

        pair.client.registerPush(kind: .apns, token: [1], topic: "com.example.app")
        #expect(try acceptRegistration(pair.peer) == .pushRegister(platform: "apns", token: [1], environment: "", topic: "com.example.app"))
        pair.client.registerPush(kind: .fcm, token: Array("fcm-token".utf8))
        #expect(try acceptRegistration(pair.peer) == .pushRegister(platform: "fcm", token: Array("fcm-token".utf8)))
        pair.client.registerPush(kind: .webhook(platform: "acme-gateway"), token: [7])
        #expect(try acceptRegistration(pair.peer) == .pushRegister(platform: "acme-gateway", token: [7]))
        // The platform-name form reads the kind from the name.
        pair.client.registerPush(platform: "apns-voip", token: [9])
        #expect(try acceptRegistration(pair.peer) == .pushRegister(platform: "apns-voip", token: [9]))
        #expect(PushTokenKind(platform: "apns-voip") == .apnsVoIP && PushTokenKind(platform: "other") == .webhook(platform: "other"))
    }

    @Test("a webhook platform that names a kind, APNs fields on another kind, an over-long topic: refused, nothing sent")
    func invalidRegistrations() throws {
        let pair = try ConnectedPair()
        defer { pair.shutdown() }
        let test = pair.test
        for (kind, environment, topic) in [
            (PushTokenKind.webhook(platform: "apns"), nil, nil), (.fcm, PushEnvironment.sandbox, nil),
            (.webhook(platform: "acme"), nil, "com.example.app"), (.apns, nil, String(repeating: "t", count: 257)),
        ] as [(PushTokenKind, PushEnvironment?, String?)] {
            let result = try test.request { test.client.registerPush(kind: kind, token: [1], environment: environment, topic: topic, completion: $0) }
            guard case .failure(.invalidArgument) = result else { Issue.record("\(kind) \(String(describing: environment)): \(result)"); continue }
        }
        // Nothing reached the server: the next frame is the PING asked for now.
        #expect(pair.client.pingNow())
        #expect(try pair.peer.readFrame() == .ping)
    }

    @Test("accepted registrations are sent again after a fresh session, not after a resumed one; unregistered and superseded ones are not")
    func resentOnFreshSession() throws {
        var pair = try ConnectedPair()
        defer { pair.shutdown() }
        pair.client.registerPush(kind: .apnsVoIP, token: [1], environment: .sandbox, topic: "com.example.app")
        _ = try acceptRegistration(pair.peer)
        pair.client.registerPush(kind: .apns, token: [2])
        _ = try acceptRegistration(pair.peer)
        pair.client.registerPush(kind: .fcm, token: [3])
        _ = try acceptRegistration(pair.peer)
        pair.client.registerPush(kind: .fcm, token: [])  // unregisters fcm
        _ = try acceptRegistration(pair.peer)
        pair.test.settle()

        // Resumed: the server kept them; nothing is sent before the PING asked for now.
        pair.peer.reset()
        let (resumed, hello) = try pair.server.acceptSession(sessionID: SessionID(high: 10, low: 20), resumed: true)
        pair.peer = resumed
        #expect(hello.resume != nil)
        #expect(pair.recorder.wait { $0.filter(\.isConnected).count == 2 })
        #expect(pair.client.pingNow())
        #expect(try pair.peer.readFrame() == .ping)
        try pair.peer.send(.pong)

        // A new VoIP token while disconnected, then a fresh session: the new token goes
        // out (it was queued first), the alert token is re-sent, fcm (unregistered) is not.
        pair.peer.reset()
        #expect(pair.recorder.wait { $0.filter(\.isWaiting).count == 2 })
        pair.client.registerPush(kind: .apnsVoIP, token: [4], environment: .production, topic: "com.example.app")
        pair.test.settle()  // queued before the WELCOME below is sent
        let (fresh, _) = try pair.server.acceptSession(sessionID: SessionID(high: 11, low: 21), resumed: false)
        pair.peer = fresh
        #expect(try acceptRegistration(pair.peer) == .pushRegister(
            platform: "apns-voip", token: [4], environment: "production", topic: "com.example.app"))
        #expect(try acceptRegistration(pair.peer) == .pushRegister(platform: "apns", token: [2]))
        pair.test.settle()
        #expect(pair.client.pingNow())
        #expect(try pair.peer.readFrame() == .ping, "nothing else is re-sent")
        // The OKs were sent before the PING was read, but the client's reader may not have
        // handled the last one yet: wait for it rather than read the count at once.
        #expect(poll(until: Date(timeIntervalSinceNow: 10)) { pair.client.status.pendingRequests == 0 })
    }
}
