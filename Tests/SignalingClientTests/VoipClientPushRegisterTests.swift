import Foundation
import Testing
import SignalingProtocol
import TestSupport
@testable import SignalingClient

/// `voipclient push-register` (a real subprocess) against a scripted server that decodes
/// the frame it sends.
@Suite("voipclient push-register on the wire")
struct VoipClientPushRegisterTests {
    /// Runs voipclient with `arguments` against a scripted server that answers the
    /// PUSH_REGISTER with OK; returns the request and the run.
    private func register(_ arguments: [String]) throws -> (Request, ExecutableRun) {
        let server = try ScriptedServer()
        let serverSide = Thread.runAsync { () throws -> Request in
            let (peer, hello) = try server.acceptSession(within: .seconds(20))
            guard hello.userID == "bob", hello.deviceID == "phone" else { throw FixtureError("HELLO from \(hello.userID)/\(hello.deviceID)") }
            let (frame, _) = try peer.readUntil(within: .seconds(20)) { if case .request = $0 { return true } else { return false } }
            guard case .request(let id, let request) = frame else { throw FixtureError("not a request") }
            try peer.send(.ok(requestID: id, serverTime: 42))
            _ = try peer.waitForClose(within: .seconds(20))
            return request
        }
        let run = try ExecutableRun.run(
            "voipclient", ["--server", "127.0.0.1:\(server.port)", "--user", "bob", "--device", "phone", "push-register"] + arguments,
            timeoutSeconds: 30)
        return (try serverSide.value(within: 30), run)
    }

    @Test("--kind apns-voip --token HEX --environment sandbox --topic ID: the frame carries each field, exit 0")
    func apnsVoIP() throws {
        let (request, run) = try register(["--kind", "apns-voip", "--token", "9A0fde01", "--environment", "sandbox", "--topic", "com.example.app"])
        #expect(request == .pushRegister(platform: "apns-voip", token: [0x9A, 0x0F, 0xDE, 0x01], environment: "sandbox", topic: "com.example.app"))
        #expect(run.exitCode == 0, "\(run.stderr)")
        #expect(run.stdout.contains("registered push token of kind apns-voip (4 bytes), sandbox, topic com.example.app"))
    }

    @Test("--kind fcm --token-text: the text's bytes, no APNs fields; --token '' unregisters; a webhook name is the platform")
    func otherKinds() throws {
        let (fcm, fcmRun) = try register(["--kind", "fcm", "--token-text", "fcm:tok-1", "--json"])
        #expect(fcm == .pushRegister(platform: "fcm", token: Array("fcm:tok-1".utf8)))
        #expect(fcmRun.exitCode == 0 && fcmRun.stdout.contains(#""event":"push_registered","#) && fcmRun.stdout.contains(#""server_time":42"#))
        let (empty, emptyRun) = try register(["--kind", "apns", "--token", ""])
        #expect(empty == .pushRegister(platform: "apns", token: []))
        #expect(emptyRun.exitCode == 0 && emptyRun.stdout.contains("unregistered"))
        let (webhook, _) = try register(["--kind", "acme-relay", "--token", "01"])
        #expect(webhook == .pushRegister(platform: "acme-relay", token: [1]))
    }
}
