import Foundation
import SignalingProtocol
import SignalingPush
import SignalingServer
import SignalingStore
import SignalingSupport
import TestSupport
import Testing

/// Push wake-ups for devices with no connection, against a real HTTP listener.
@Suite("Push wake-ups end to end")
struct PushWakeUpTests {
    /// A server with a durable store and a push gateway pointing at `gateway`.
    private func server(_ gateway: RecordingHTTPServer, _ configure: (inout ServerConfiguration) -> Void = { _ in }) throws -> TestServer {
        try TestServer(store: ModelEventStore()) { configuration in
            var push = try! PushGatewayConfiguration(url: gateway.url())
            push.tickInterval = .milliseconds(5)
            push.requestTimeout = .seconds(2)
            configuration.pushGateway = push
            configure(&configuration)
        }
    }

    /// Connects bob's phone, registers its push token, and disconnects it.
    private func registerOfflinePhone(_ server: TestServer, token: String = "apns-token-1") throws {
        let (phone, _) = try server.connect(user: "bob", device: "phone")
        #expect(try phone.request(1, .pushRegister(platform: "apns", token: Array(token.utf8))).isOK)
        _ = consume phone
        try server.waitFor("bob's phone to go offline") { $0.establishedConnections == 0 }
    }

    private func json(_ request: RecordingHTTPServer.Request) throws -> [String: Any] {
        try #require(try JSONSerialization.jsonObject(with: Data(request.body)) as? [String: Any])
    }

    @Test("a call to an offline callee wakes its device, which rings if it connects within the ring timeout")
    func callWakesOfflineCallee() throws {
        let gateway = try RecordingHTTPServer()
        let server = try server(gateway)
        try registerOfflinePhone(server)
        let (alice, _) = try server.connect(user: "alice")

        #expect(try alice.request(1, .callInvite(callID: "c1", callee: "bob", offer: Array("secret-sdp".utf8))).isOK)
        #expect(gateway.waitForRequests(1))
        let wake = try json(gateway.requests[0])
        #expect(wake["user"] as? String == "bob")
        #expect(wake["device"] as? String == "phone")
        #expect(wake["kind"] as? String == "call")
        #expect(wake["token"] as? String == "apns-token-1")
        #expect(!gateway.requests[0].bodyText.contains("secret-sdp"), "a wake-up must never carry the offer")
        #expect(try alice.staysSilent(for: .milliseconds(30)), "the caller must not be told 'unreachable' yet")

        // Woken, the phone connects within the ring timeout: the call rings and is answered.
        try server.advance(by: .seconds(20))
        let (phone, _) = try server.connect(user: "bob", device: "phone")
        guard case .callIncoming("c1", "alice", _, _, _) = try phone.nextEvent().event else {
            Issue.record("the woken device did not ring"); return
        }
        #expect(try phone.request(2, .callAccept(callID: "c1", answer: [1])).isOK)
        #expect(try alice.nextEvent().event == .callAccepted(callID: "c1", device: "phone", answer: [1]))
    }

    @Test("nobody comes: the caller gets unreachable, the callee a missed call when it next connects")
    func missedCallPath() throws {
        let gateway = try RecordingHTTPServer()
        let server = try server(gateway)
        try registerOfflinePhone(server)
        let (alice, _) = try server.connect(user: "alice")
        #expect(try alice.request(1, .callInvite(callID: "c1", callee: "bob", offer: [])).isOK)
        #expect(gateway.waitForRequests(1))

        try server.advance(by: .seconds(61))
        guard case .callEnded("c1", .unreachable, "bob", _) = try alice.nextEvent().event else {
            Issue.record("the caller was not told"); return
        }
        // The missed call is an event for the phone, and wakes it once more.
        #expect(gateway.waitUntil { $0.requests.contains { $0.bodyText.contains("\"missedCall\"") } })
        let (phone, _) = try server.connect(user: "bob", device: "phone")
        guard case .callEnded("c1", .noAnswer, "alice", _) = try phone.nextEvent().event else {
            Issue.record("no missed call for the callee"); return
        }
    }

    @Test("a message for an offline device wakes it with a counter and never the content")
    func messageWakeUp() throws {
        let gateway = try RecordingHTTPServer()
        let server = try server(gateway)
        try registerOfflinePhone(server)
        let (alice, _) = try server.connect(user: "alice")
        #expect(try alice.request(1, .messageSend(OutgoingMessage(
            messageID: "m1", recipient: "bob", contentType: "text/plain", body: Array("top secret".utf8)))).isOK)
        #expect(gateway.waitForRequests(1))
        let wake = try json(gateway.requests[0])
        #expect(wake["kind"] as? String == "message")
        #expect(wake["pending"] as? Int == 1)
        #expect(!gateway.requests[0].bodyText.contains("top secret"))
        #expect(gateway.requests[0].body.count <= 4096)
    }

    @Test("a gateway that hangs never holds up delivery to connected devices")
    func hangingGateway() throws {
        let gateway = try RecordingHTTPServer()
        gateway.reply(.hang)
        let server = try server(gateway)
        try registerOfflinePhone(server)
        let (alice, _) = try server.connect(user: "alice")
        let (carol, _) = try server.connect(user: "carol")

        #expect(try alice.request(1, .messageSend(OutgoingMessage(messageID: "m1", recipient: "bob", contentType: "t", body: []))).isOK)
        #expect(gateway.waitForRequests(1))
        #expect(server.server.pushStatistics?.inFlight == 1)
        // While the wake-up for bob hangs, carol's messages flow as usual.
        for index in 2...20 {
            #expect(try alice.request(UInt32(index), .messageSend(OutgoingMessage(
                messageID: "m\(index)", recipient: "carol", contentType: "t", body: []))).isOK)
            guard case .message = try carol.nextEvent().event else { Issue.record("not delivered"); return }
        }
        #expect(server.server.pushStatistics?.inFlight == 1, "the request was still hanging throughout")
    }

    @Test("without a gateway, an offline device is simply not woken and a call to it fails at once")
    func noGateway() throws {
        let server = try TestServer(store: ModelEventStore())
        try registerOfflinePhone(server)
        let (alice, _) = try server.connect(user: "alice")
        #expect(try alice.request(1, .callInvite(callID: "c1", callee: "bob", offer: [])).isOK)
        guard case .callEnded("c1", .unreachable, "bob", _) = try alice.nextEvent().event else {
            Issue.record("expected unreachable at once"); return
        }
        #expect(server.server.pushStatistics == nil)
    }
}
