import Foundation
import Testing
import SignalingProtocol
import SignalingSupport
import TestSupport
@testable import SignalingClient

/// The client library against a real `voipserver` subprocess with a TLS-only listener
/// (`--tls-listen`), a certificate from a throw-away CA.
@Suite("Client over TLS against voipserver --tls-listen")
struct TLSEndToEndTests {
    struct TLSServer {
        let certificates: TestCertificates
        let process: ServerProcess
        var port: UInt16 { process.tlsPort ?? 0 }
    }

    static func startServer() throws -> TLSServer {
        let certificates = try TestCertificates()
        let process = try ServerProcess([
            "--tls-listen", "127.0.0.1:0", "--tls-cert", certificates.serverChainFile, "--tls-key", certificates.serverKeyFile,
            "--store", "memory", "--workers", "1",
        ])
        return TLSServer(certificates: certificates, process: process)
    }

    static func client(_ server: TLSServer, user: String, device: String, host: String = "127.0.0.1",
                       caFile: String? = nil) throws -> TestClient {
        try TestClient(port: server.port, host: host, user: user, device: device) { configuration in
            configuration.tls = ClientTLSConfiguration(caFile: caFile ?? server.certificates.caFile)
        }
    }

    @Test("two devices over TLS 1.3: the session says TLS and vsig/1, a call is set up and a message crosses with its receipt")
    func callAndMessage() throws {
        let server = try Self.startServer()
        let alice = try Self.client(server, user: "alice", device: "phone-a", host: "localhost")
        let bob = try Self.client(server, user: "bob", device: "phone-b")
        defer { alice.client.shutdown(); bob.client.shutdown() }
        let session = try alice.connectAndSettle()
        #expect(session.tls == TLSSessionDetails(version: .v1_3, alpn: "vsig/1", resumed: false))
        try bob.connectAndSettle()

        let callID = alice.client.invite(callee: "bob", offer: [1, 2, 3])
        #expect(bob.recorder.first { if case .incomingCall(let call) = $0 { return call.callID == callID } else { return false } } != nil)
        #expect(try bob.request { bob.client.accept(callID: callID, answer: [9], completion: $0) }.isSuccess)
        #expect(alice.recorder.first { $0 == .callAccepted(callID: callID, device: "phone-b", answer: [9]) } != nil)
        #expect(try alice.request { alice.client.hangUp(callID: callID, completion: $0) }.isSuccess)

        let sent = try alice.request { alice.client.send(to: "bob", body: Array("over TLS".utf8), messageID: "t-1", completion: $0) }
        #expect(sent.isSuccess, "\(sent)")
        #expect(bob.recorder.wait { _ in bob.recorder.messages.contains { $0.messageID == "t-1" && $0.body == Array("over TLS".utf8) } })
        #expect(alice.recorder.first { if case .deliveryReceipt(let receipt) = $0 { return receipt.messageID == "t-1" } else { return false } } != nil)
    }

    @Test("a lost connection reconnects by itself and resumes both the TLS session (its ticket) and the protocol session, and events sent meanwhile arrive")
    func reconnectResumesTLS() throws {
        let server = try Self.startServer()
        let alice = try Self.client(server, user: "alice", device: "phone-a")
        let bob = try Self.client(server, user: "bob", device: "phone-b")
        defer { alice.client.shutdown(); bob.client.shutdown() }
        let first = try bob.connectAndSettle()
        #expect(first.tls?.resumed == false)
        try alice.connectAndSettle()

        // The network drops bob's connection (no CLOSE, no close_notify).
        bob.core.queue.sync { bob.core.currentConnection?.abort() }
        let back = bob.recorder.first(after: 1) { $0.connectedSession != nil && $0.connectedSession != first }
        let info = try #require(back?.connectedSession, "bob did not reconnect")
        #expect(info.tls?.resumed == true, "the reconnect did a full TLS handshake")
        #expect(info.resumed && info.sessionID == first.sessionID)
        #expect(try alice.request { alice.client.send(to: "bob", body: [7], messageID: "after", completion: $0) }.isSuccess)
        #expect(bob.recorder.wait { _ in bob.recorder.messages.contains { $0.messageID == "after" } })
    }

    @Test("a client that does not trust the server's CA gets certificateRejected from the real server, and a plain client at the TLS port is told apart")
    func untrustedAndPlainClients() throws {
        let server = try Self.startServer()
        let stranger = try TestCertificates()
        let untrusting = try Self.client(server, user: "carol", device: "phone", caFile: stranger.caFile)
        defer { untrusting.client.shutdown() }
        do {
            try untrusting.client.connect(timeout: .seconds(5))
            Issue.record("connected with an untrusted certificate")
        } catch {
            guard case .certificateRejected = error else { Issue.record("expected certificateRejected, got \(error)"); return }
        }

        let plain = try TestClient(port: server.port, user: "dave", device: "phone")
        defer { plain.client.shutdown() }
        do {
            try plain.client.connect(timeout: .seconds(5))
            Issue.record("a plain client was served by the TLS listener")
        } catch {
            #expect(error == .closedDuringHandshake || { if case .protocolViolation = error { return true } else { return false } }(), "\(error)")
        }
    }
}
