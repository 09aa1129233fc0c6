import Foundation
import Testing
import SignalingProtocol
import SignalingSupport
import SignalingTLS
import TestSupport
@testable import SignalingClient
#if canImport(Glibc)
import Glibc
#endif

/// The client library over TLS against a scripted server that does the server side of a
/// real OpenSSL handshake (ScriptedServer with a TLSServerContext).
@Suite("Client over TLS (in-process TLS acceptor)")
struct TLSConnectTests {
    /// A scripted TLS server with the throw-away CA's certificate for localhost/127.0.0.1.
    static func tlsServer(_ certificates: TestCertificates, chain: String? = nil, key: String? = nil,
                          alpn: String? = signalingALPN) throws -> ScriptedServer {
        let context = try TLSServerContext(
            certificateChainFile: chain ?? certificates.serverChainFile, privateKeyFile: key ?? certificates.serverKeyFile, alpn: alpn)
        return try ScriptedServer(tls: context)
    }

    static func client(_ server: ScriptedServer, host: String = "127.0.0.1", _ tls: ClientTLSConfiguration,
                       configure: (inout ClientConfiguration) -> Void = { _ in }) throws -> TestClient {
        try TestClient(port: server.port, host: host) { configuration in
            configuration.tls = tls
            configure(&configuration)
        }
    }

    /// Runs `connect` against a server thread that accepts once (its handshake may fail);
    /// returns the client's error, or nil when it connected.
    static func connectError(_ test: TestClient, _ server: ScriptedServer) -> ConnectError? {
        let serverSide = Thread.runAsync { () throws in
            let peer = try server.accept()
            _ = try? peer.waitForClose(within: .seconds(3))
        }
        defer { _ = try? serverSide.value() }
        do {
            try test.client.connect(timeout: .seconds(5))
            return nil
        } catch {
            return error
        }
    }

    @Test("a client that trusts the CA connects with TLS 1.3 and ALPN vsig/1; HELLO, events and requests cross it")
    func connectsAndExchangesFrames() throws {
        let certificates = try TestCertificates()
        let server = try Self.tlsServer(certificates)
        let test = try Self.client(server, ClientTLSConfiguration(caFile: certificates.caFile))
        defer { test.client.shutdown() }
        let serverSide = Thread.runAsync { try server.acceptSession(sessionID: SessionID(high: 3, low: 4)) }
        let info = try test.client.connect(timeout: .seconds(5))
        let (peer, hello) = try serverSide.value()
        #expect(info.sessionID == SessionID(high: 3, low: 4))
        #expect(hello.userID == "alice" && hello.deviceID == "phone")
        let tls = try #require(peer.tls)
        #expect(tls.version == .v1_3)
        #expect(tls.alpn == "vsig/1")

        // Several events in one burst: TLS may hand them over in one record or several,
        // and bytes OpenSSL holds must be read without waiting for another poll.
        for seq in 1...5 {
            try peer.sendEvent(seq: UInt64(seq), .message(DeliveredMessage(
                messageID: "m\(seq)", sender: "bob", senderDevice: "laptop", recipient: "alice", contentType: "text/plain",
                body: Array(repeating: UInt8(seq), count: 20_000), serverTime: 1)))
        }
        #expect(test.recorder.wait { _ in test.recorder.messages.count == 5 })
        #expect(test.recorder.messages.map(\.messageID) == ["m1", "m2", "m3", "m4", "m5"])
        // ACKs are per batch; the last one covers all five.
        #expect(throws: Never.self) { try peer.readUntil { $0 == .ack(seq: 5) } }

        test.client.send(to: "bob", body: Array("hi over TLS".utf8)) { _ in }
        let (request, _) = try peer.readUntil { if case .request = $0 { return true } else { return false } }
        guard case .request(_, .messageSend(let message)) = request else { Issue.record("got \(request)"); return }
        #expect(message.body == Array("hi over TLS".utf8))
    }

    @Test("the certificate is checked against the host dialled: localhost and 127.0.0.1 pass, a certificate for another name is rejected with hostname mismatch")
    func nameIsChecked() throws {
        let certificates = try TestCertificates()
        for host in ["localhost", "127.0.0.1"] {
            let server = try Self.tlsServer(certificates)
            let test = try Self.client(server, host: host, ClientTLSConfiguration(caFile: certificates.caFile))
            let serverSide = Thread.runAsync { try server.acceptSession() }
            #expect(throws: Never.self, "dialling \(host)") { try test.client.connect(timeout: .seconds(5)) }
            _ = try serverSide.value()
            test.client.shutdown()
        }

        let other = try certificates.makeServer(named: "signal.example.com", file: "other-name")
        let server = try Self.tlsServer(certificates, chain: other.chain, key: other.key)
        let test = try Self.client(server, host: "localhost", ClientTLSConfiguration(caFile: certificates.caFile))
        defer { test.client.shutdown() }
        let error = Self.connectError(test, server)
        guard case .certificateRejected(let reason) = error else { Issue.record("expected certificateRejected, got \(String(describing: error))"); return }
        #expect(reason.contains("hostname mismatch"), "\(reason)")
        #expect(error?.description.contains("certificate was rejected") == true)

        // The same certificate is right when the app names the server it expects.
        let named = try Self.tlsServer(certificates, chain: other.chain, key: other.key)
        let renamed = try Self.client(named, host: "127.0.0.1", ClientTLSConfiguration(caFile: certificates.caFile, serverName: "signal.example.com"))
        defer { renamed.client.shutdown() }
        let serverSide = Thread.runAsync { try named.acceptSession() }
        #expect(throws: Never.self) { try renamed.client.connect(timeout: .seconds(5)) }
        _ = try serverSide.value()
    }

    @Test("a certificate from an untrusted CA is rejected with OpenSSL's reason, and the next attempt waits the long certificate delay, not the back-off")
    func untrustedCAWaitsLong() throws {
        let certificates = try TestCertificates(), stranger = try TestCertificates()
        let server = try Self.tlsServer(certificates)
        let test = try Self.client(server, ClientTLSConfiguration(caFile: stranger.caFile)) { configuration in
            configuration.reconnect.certificateFailureDelay = .seconds(200)
        }
        defer { test.client.shutdown() }
        let error = Self.connectError(test, server)
        guard case .certificateRejected(let reason) = error else { Issue.record("expected certificateRejected, got \(String(describing: error))"); return }
        #expect(reason.contains("unable to get local issuer certificate") || reason.contains("self-signed"), "\(reason)")
        #expect(error?.isCertificateFailure == true)
        let waiting = test.recorder.first { if case .connectionStateChanged(.waitingToReconnect) = $0 { return true } else { return false } }
        guard case .connectionStateChanged(.waitingToReconnect(let delay, let why))? = waiting else {
            Issue.record("no waiting state: \(test.recorder.all)")
            return
        }
        // The back-off here would be at most 50 ms (TestClient's policy).
        #expect(delay >= .seconds(100) && delay <= .seconds(200), "waits \(delay)")
        #expect(why == .connectFailed(error!))
    }

    @Test("pins: a matching pin among others connects; pins for other keys fail with pinMismatch naming the key presented")
    func pins() throws {
        let certificates = try TestCertificates()
        let actual = try #require(PublicKeyPin(hex: try certificates.publicKeySHA256(ofCertificate: certificates.serverChainFile)))
        let next = try certificates.makeServer(named: "localhost", file: "next-key")
        let other = try #require(PublicKeyPin(hex: try certificates.publicKeySHA256(ofCertificate: next.chain)))

        let server = try Self.tlsServer(certificates)
        let pinned = try Self.client(server, ClientTLSConfiguration(caFile: certificates.caFile, pins: [other, actual]))
        let serverSide = Thread.runAsync { try server.acceptSession() }
        #expect(throws: Never.self) { try pinned.client.connect(timeout: .seconds(5)) }
        _ = try serverSide.value()
        pinned.client.shutdown()

        let mismatched = try Self.client(server, ClientTLSConfiguration(caFile: certificates.caFile, pins: [other])) { configuration in
            configuration.reconnect.certificateFailureDelay = .seconds(200)
        }
        defer { mismatched.client.shutdown() }
        let error = Self.connectError(mismatched, server)
        #expect(error == .pinMismatch(presented: actual.description))
        #expect(error?.isCertificateFailure == true)
    }

    @Test("a server that does not speak ALPN vsig/1 fails the handshake with tlsHandshakeFailed, retried with the ordinary back-off")
    func alpnRefused() throws {
        let certificates = try TestCertificates()
        let server = try Self.tlsServer(certificates, alpn: "h2")
        let test = try Self.client(server, ClientTLSConfiguration(caFile: certificates.caFile))
        defer { test.client.shutdown() }
        let error = Self.connectError(test, server)
        guard case .tlsHandshakeFailed(let reason) = error else { Issue.record("expected tlsHandshakeFailed, got \(String(describing: error))"); return }
        #expect(reason.contains("no application protocol"), "\(reason)")
        let waiting = test.recorder.first { $0.isWaiting }
        guard case .connectionStateChanged(.waitingToReconnect(let delay, _))? = waiting else { Issue.record("no waiting state"); return }
        #expect(delay <= .milliseconds(50))
    }

    @Test("a TLS client at a plain-TCP port fails with a TLS error, not a hang")
    func tlsClientAtPlainPort() throws {
        let certificates = try TestCertificates()
        let server = try ScriptedServer()
        let test = try Self.client(server, ClientTLSConfiguration(caFile: certificates.caFile))
        defer { test.client.shutdown() }
        let serverSide = Thread.runAsync { () throws in
            let peer = try server.accept()
            // What voipserver answers to bytes that are not a HELLO.
            try peer.send(.close(Close(code: .malformedFrame, message: "bad frame")))
            peer.close()
        }
        let started = Date()
        do {
            try test.client.connect(timeout: .seconds(5))
            Issue.record("connected over TLS to a plain port")
        } catch {
            guard case .tlsHandshakeFailed = error else { Issue.record("expected tlsHandshakeFailed, got \(error)"); return }
        }
        #expect(Date().timeIntervalSince(started) < 4)
        try serverSide.value()
    }

    @Test("after a reset a reconnect offers the ticket of the last connection and the server resumes the TLS session")
    func reconnectResumesTheSession() throws {
        let certificates = try TestCertificates()
        let server = try Self.tlsServer(certificates)
        let test = try Self.client(server, ClientTLSConfiguration(caFile: certificates.caFile))
        defer { test.client.shutdown() }
        let first = Thread.runAsync { try server.acceptSession(sessionID: SessionID(high: 1, low: 2)) }
        try test.client.connect(timeout: .seconds(5))
        let (peer, _) = try first.value()
        #expect(peer.tls?.resumedSession == false)
        test.settle()

        // The network resets the connection (no CLOSE, no close_notify: OpenSSL would mark
        // the connection's own session not resumable): the client reconnects by itself.
        let second = Thread.runAsync { try server.acceptSession(sessionID: SessionID(high: 1, low: 2), resumed: true) }
        peer.reset()
        let (again, hello) = try second.value()
        #expect(hello.resume?.sessionID == SessionID(high: 1, low: 2))
        #expect(again.tls?.resumedSession == true, "the reconnect did a full TLS handshake")
        #expect(test.recorder.wait { $0.filter(\.isConnected).count == 2 })
    }

    @Test("closing the client sends TLS close_notify before the socket closes")
    func closeSendsCloseNotify() throws {
        let certificates = try TestCertificates()
        let server = try Self.tlsServer(certificates)
        let test = try Self.client(server, ClientTLSConfiguration(caFile: certificates.caFile))
        let serverSide = Thread.runAsync { try server.acceptSession() }
        try test.client.connect(timeout: .seconds(5))
        let (peer, _) = try serverSide.value()
        test.client.shutdown()
        // Past OpenSSL, on the raw socket: one record (the encrypted close_notify alert)
        // arrives before the EOF; a close without it would show the EOF alone.
        var raw: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 512)
        while waitReadable(peer.descriptor, .seconds(5)) {
            let count = chunk.withUnsafeMutableBytes { recv(peer.descriptor, $0.baseAddress, $0.count, 0) }
            if count <= 0 { break }
            raw += chunk[0..<count]
        }
        #expect(raw.count >= 5 + 2, "no TLS record before the close: \(raw)")
        // A TLS 1.3 record hides its type: application_data (23) outside, the alert inside.
        #expect(raw.first == 23 || raw.first == 21, "\(raw)")
    }

    @Test("a CA file that cannot be loaded fails the client's creation with an error naming the file")
    func badCAFileIsAConfigurationError() throws {
        let certificates = try TestCertificates()
        let missing = certificates.directory.file("no-such-ca.pem")
        var configuration = ClientConfiguration(host: "127.0.0.1", port: 7443, userID: "alice", deviceID: "phone")
        configuration.tls = ClientTLSConfiguration(caFile: missing)
        do {
            _ = try SignalingClient(configuration: configuration, eventQueue: DispatchQueue(label: "t")) { _ in }
            Issue.record("a missing CA file was accepted")
        } catch {
            #expect(error.description.contains(missing), "\(error)")
        }
        configuration.tls = ClientTLSConfiguration(caFile: certificates.caFile, serverName: "")
        #expect(throws: ClientConfigurationError.self) {
            try SignalingClient(configuration: configuration, eventQueue: DispatchQueue(label: "t")) { _ in }
        }
    }
}
