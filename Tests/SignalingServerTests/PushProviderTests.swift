import Foundation
import SignalingCrypto
import SignalingProtocol
import SignalingPush
import SignalingServer
import SignalingStore
import SignalingSupport
import TestSupport
import Testing

/// The server waking iPhones through APNs and Android phones through FCM, both played by
/// Tools/mock-push-service.py (real HTTP/2 over TLS under a test CA).
@Suite("Push through APNs and FCM end to end", .serialized)
struct PushProviderTests {
    final class Setup {
        let pki: PushTestPKI
        let mock: MockPushService
        let store = ModelEventStore()
        let server: TestServer

        init(_ configure: (inout ServerConfiguration) -> Void = { _ in }) throws {
            pki = try PushTestPKI()
            mock = try MockPushService(pki: pki)
            try pki.writeServiceAccount(tokenURI: mock.baseURL + "/token")
            let (configuration, _) = try ServerOptions.configuration(from: [
                "--apns-key-file", pki.apnsKeyFile, "--apns-key-id", PushTestPKI.apnsKeyID, "--apns-team-id", PushTestPKI.apnsTeamID,
                "--apns-topic", "com.example.app", "--apns-url", mock.baseURL, "--apns-sandbox-url", mock.baseURL,
                "--fcm-service-account", pki.serviceAccountFile, "--fcm-url", mock.baseURL, "--push-ca-file", pki.caFile,
            ])
            var push = try #require(configuration.pushGateway)
            push.tickInterval = .milliseconds(5)
            server = try TestServer(store: store) { server in
                server.pushGateway = push
                server.ringTimeout = .seconds(45)
                configure(&server)
            }
        }

        deinit { mock.stop() }
    }

    /// Connects `user`'s `device`, registers `registrations`, and disconnects it.
    private func registerOffline(_ setup: Setup, user: String, device: String, _ registrations: [Request]) throws {
        let (client, _) = try setup.server.connect(user: user, device: device)
        for (index, registration) in registrations.enumerated() {
            #expect(try client.request(UInt32(index + 1), registration).isOK)
        }
        _ = consume client
        try setup.server.waitFor("\(device) to go offline") { $0.establishedConnections == 0 }
    }

    @Test("a call to an offline iPhone: a VoIP push to <bundle>.voip that expires with the ring; the phone connects and answers")
    func callToOfflineIPhone() throws {
        let setup = try Setup()
        let voip: [UInt8] = [UInt8](repeating: 0xA1, count: 32)
        try registerOffline(setup, user: "bob", device: "iphone", [
            .pushRegister(platform: "apns", token: [UInt8](repeating: 0xB2, count: 32)),
            .pushRegister(platform: "apns-voip", token: voip, environment: "sandbox", topic: nil),
        ])
        let (alice, _) = try setup.server.connect(user: "alice")
        #expect(try alice.request(1, .callInvite(callID: "c1", callee: "bob", offer: Array("secret-sdp".utf8))).isOK)
        let push = try #require(try setup.mock.waitFor("the VoIP push") { !$0.isEmpty }.first)
        #expect(push.path == "/3/device/" + voip.map { String(format: "%02x", $0) }.joined())
        #expect(push.headers["apns-push-type"] == "voip" && push.headers["apns-topic"] == "com.example.app.voip")
        #expect(push.headers["apns-priority"] == "10")
        #expect(push.headers["apns-expiration"] == String(setup.server.clock.wallMilliseconds() / 1000 + 45))
        #expect(push.auth == "ok")
        #expect(!push.body.contains("secret-sdp"))

        try setup.server.advance(by: .seconds(10))
        let (phone, _) = try setup.server.connect(user: "bob", device: "iphone")
        guard case .callIncoming("c1", "alice", _, _, _) = try phone.nextEvent().event else {
            Issue.record("the woken iPhone did not ring"); return
        }
        #expect(try phone.request(1, .callAccept(callID: "c1", answer: [1])).isOK)
        #expect(try alice.nextEvent().event == .callAccepted(callID: "c1", device: "iphone", answer: [1]))
    }

    @Test("a message to an offline Android phone: an FCM message with a counter and never the text")
    func messageToOfflineAndroid() throws {
        let setup = try Setup()
        try registerOffline(setup, user: "carol", device: "pixel", [.pushRegister(platform: "fcm", token: Array("fcm-token-1".utf8))])
        let (alice, _) = try setup.server.connect(user: "alice")
        let message = OutgoingMessage(messageID: "m1", recipient: "carol", contentType: "text/plain", body: Array("meet at noon".utf8))
        #expect(try alice.request(1, .messageSend(message)).isOK)
        let send = try #require(try setup.mock.waitFor("the FCM message") { $0.contains { $0.path.hasSuffix(":send") } }
            .first { $0.path.hasSuffix(":send") })
        #expect(send.auth == "ok")
        let body = try #require(send.json["message"] as? [String: Any])
        #expect(body["token"] as? String == "fcm-token-1")
        #expect((body["data"] as? [String: String])?["kind"] == "message")
        #expect((body["android"] as? [String: Any])?["collapse_key"] != nil)
        #expect(!send.body.contains("meet at noon"))
    }

    @Test("a token APNs calls Unregistered is removed from the device and the store; the device's other token stays")
    func unregisteredTokenRemoved() throws {
        let setup = try Setup()
        try setup.mock.script([["status": 410, "reason": "Unregistered", "match": "/3/device"]])
        try registerOffline(setup, user: "bob", device: "iphone", [
            .pushRegister(platform: "apns-voip", token: [1, 2, 3]), .pushRegister(platform: "fcm", token: Array("f".utf8)),
        ])
        let (alice, _) = try setup.server.connect(user: "alice")
        #expect(try alice.request(1, .callInvite(callID: "c1", callee: "bob", offer: [])).isOK)
        try setup.mock.waitFor("the refused push") { $0.count == 1 }
        let deadline = Date().addingTimeInterval(10)
        while !setup.store.appliedChanges.contains(.removePush(user: "bob", device: "iphone", kind: .apnsVoIP)) {
            guard Date() < deadline else { Issue.record("no removePush reached the store"); return }
            usleep(5_000)
        }
        #expect(setup.server.server.pushStatistics?.tokensRemoved == 1)
        // The next call (after the per-device interval) uses what is left: the FCM token.
        try setup.server.advance(by: .seconds(11))
        #expect(try alice.request(2, .callInvite(callID: "c2", callee: "bob", offer: [])).isOK)
        try setup.mock.waitFor("the FCM message for the second call") { $0.contains { $0.path.hasSuffix(":send") } }
        #expect(setup.mock.requests.filter { $0.path.hasPrefix("/3/device") }.count == 1)
    }

    @Test("a push service that hangs never holds up delivery to connected devices")
    func hangingServiceIsolated() throws {
        let setup = try Setup()
        try setup.mock.command(["hang": true])
        try registerOffline(setup, user: "bob", device: "iphone", [.pushRegister(platform: "apns", token: [9, 9])])
        let (alice, _) = try setup.server.connect(user: "alice")
        let (dave, _) = try setup.server.connect(user: "dave")
        for index in 0..<20 {
            let message = OutgoingMessage(messageID: "b\(index)", recipient: "bob", contentType: "text/plain", body: [1])
            #expect(try alice.request(UInt32(index + 1), .messageSend(message)).isOK)
        }
        try setup.mock.waitFor("the hanging push") { !$0.isEmpty }
        let message = OutgoingMessage(messageID: "d1", recipient: "dave", contentType: "text/plain", body: [7])
        #expect(try alice.request(100, .messageSend(message)).isOK)
        guard case .message(let delivered) = try dave.nextEvent(timeout: .seconds(2)).event else {
            Issue.record("dave got no message"); return
        }
        #expect(delivered.body == [7])
    }

    @Test("PUSH_REGISTER with an environment other than production or sandbox is refused with badRequest")
    func badEnvironment() throws {
        let setup = try Setup()
        let (phone, _) = try setup.server.connect(user: "bob", device: "iphone")
        let reply = try phone.request(1, .pushRegister(platform: "apns", token: [1], environment: "staging"))
        guard case .error(_, .badRequest, _) = reply else { Issue.record("expected badRequest, got \(reply)"); return }
        #expect(try phone.request(2, .pushRegister(platform: "apns", token: [1], environment: "production")).isOK)
    }
}
