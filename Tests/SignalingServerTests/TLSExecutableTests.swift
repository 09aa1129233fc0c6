import Foundation
import SignalingProtocol
import SignalingServer
import SignalingSupport
import SignalingTLS
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// TLS on the real `voipserver` with real peers: `openssl s_client`, the test client over
/// SignalingTLS, a restart that resumes sessions, SIGHUP, and haproxy in front.
@Suite("TLS on the real voipserver")
struct TLSExecutableTests {
    /// The options of a TLS listener on a free loopback port serving `certificates`.
    private func tlsOptions(_ certificates: TestCertificates, chain: String? = nil, key: String? = nil) -> [String] {
        ["--tls-listen", "127.0.0.1:0", "--tls-cert", chain ?? certificates.serverChainFile, "--tls-key", key ?? certificates.serverKeyFile]
    }

    /// `openssl s_client` against `port` with stdin at its end, so it handshakes, prints
    /// the session and leaves.
    private func sClient(_ port: UInt16, _ certificates: TestCertificates, _ extra: String = "") throws -> ExecutableRun {
        try ExecutableRun.runProgram("/bin/sh", [
            "-c",
            "openssl s_client -connect 127.0.0.1:\(port) -servername localhost -CAfile '\(certificates.caFile)' "
                + "-alpn vsig/1 -verify_return_error \(extra) < /dev/null 2>&1",
        ], timeoutSeconds: 30)
    }

    @Test("openssl s_client completes a TLS 1.3 handshake with ALPN vsig/1 and a verified certificate against a TLS-only voipserver")
    func sClientHandshake() throws {
        let certificates = try TestCertificates()
        let server = try ServerProcess(["--listen", "off", "--store", "memory"] + tlsOptions(certificates))
        #expect(server.port == 0)
        let tlsPort = try #require(server.tlsPort)
        let run = try sClient(tlsPort, certificates)
        #expect(run.exitCode == 0, "\(run.stdout)")
        #expect(run.stdout.contains("New, TLSv1.3"), "\(run.stdout)")
        #expect(run.stdout.contains("ALPN protocol: vsig/1"), "\(run.stdout)")
        #expect(run.stdout.contains("Verify return code: 0 (ok)"), "\(run.stdout)")
        #expect(server.log.contains("addr=off tls_addr=127.0.0.1:\(tlsPort)"), "\(server.log)")
        #expect(server.log.contains("event=tls_certificate cert=\(certificates.serverChainFile)"), "\(server.log)")
    }

    @Test("the server picks TLS_AES_128_GCM_SHA256 from a client that lists AES-256-GCM first, ChaCha20 for a client that lists it first, and serves a client that offers only AES-256-GCM")
    func cipherSuiteOrder() throws {
        let certificates = try TestCertificates()
        let server = try ServerProcess(["--listen", "off", "--store", "memory"] + tlsOptions(certificates))
        let tlsPort = try #require(server.tlsPort)
        let suites = [
            "TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256:TLS_AES_128_GCM_SHA256": "TLS_AES_128_GCM_SHA256",
            "TLS_AES_256_GCM_SHA384": "TLS_AES_256_GCM_SHA384",
            // A phone without AES instructions lists ChaCha20 first.
            "TLS_CHACHA20_POLY1305_SHA256:TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384": "TLS_CHACHA20_POLY1305_SHA256",
        ]
        for (offered, chosen) in suites {
            let run = try sClient(tlsPort, certificates, "-ciphersuites \(offered)")
            #expect(run.exitCode == 0, "\(run.stdout)")
            #expect(run.stdout.contains("New, TLSv1.3, Cipher is \(chosen)"), "offered \(offered): \(run.stdout)")
        }
    }

    @Test("--tls-min-version 1.3 (the default) refuses a TLS 1.2-only client, logged as reason=version; 1.2 accepts it")
    func minimumVersion() throws {
        let certificates = try TestCertificates()
        let strict = try ServerProcess(["--listen", "off", "--store", "memory"] + tlsOptions(certificates))
        let refused = try sClient(try #require(strict.tlsPort), certificates, "-tls1_2")
        #expect(refused.exitCode != 0)
        #expect(refused.stdout.contains("alert protocol version"), "\(refused.stdout)")
        let deadline = SystemClock().now() + .seconds(10)
        while !strict.log.contains("event=tls_handshake_failed") && SystemClock().now() < deadline { usleep(10_000) }
        #expect(strict.log.contains("reason=version"), "\(strict.log)")

        let lenient = try ServerProcess(["--listen", "off", "--store", "memory", "--tls-min-version", "1.2"] + tlsOptions(certificates))
        let accepted = try sClient(try #require(lenient.tlsPort), certificates, "-tls1_2")
        #expect(accepted.exitCode == 0, "\(accepted.stdout)")
        #expect(accepted.stdout.contains("New, TLSv1.2"), "\(accepted.stdout)")
        #expect(accepted.stdout.contains("ALPN protocol: vsig/1"), "\(accepted.stdout)")
    }

    @Test("both listeners: a plain device and a TLS device talk to each other, and /metrics counts each transport")
    func bothListeners() throws {
        let certificates = try TestCertificates()
        let server = try ServerProcess(["--store", "memory", "--admin-listen", "127.0.0.1:0"] + tlsOptions(certificates))
        let tlsPort = try #require(server.tlsPort)
        #expect(server.port != 0 && server.port != tlsPort)
        let plain = try TestClient(port: server.port)
        try plain.hello(user: "alice")
        let secure = try TestClient(port: tlsPort, tls: TestTLS(caFile: certificates.caFile))
        try secure.hello(user: "bob")
        #expect(try plain.request(1, .messageSend(OutgoingMessage(
            messageID: "m1", recipient: "bob", contentType: "text/plain", body: Array("hi".utf8)))).isOK)
        guard case .message(let message) = try secure.nextEvent().event else { Issue.record("no message over TLS"); return }
        #expect(message.body == Array("hi".utf8))

        let adminPort = try #require(ServiceDeploymentTests.adminPort(in: server.log))
        let families = try PrometheusParser.parse(try HTTPRequest.send("GET", port: adminPort, "/metrics").text)
        func value(_ family: String, _ sample: String, _ labels: [String: String]) -> Double? {
            families[family]?.samples.first { $0.name == sample && $0.labels == labels }?.value
        }
        #expect(value("voipserver_connections", "voipserver_connections", ["state": "established", "transport": "plain"]) == 1)
        #expect(value("voipserver_connections", "voipserver_connections", ["state": "established", "transport": "tls"]) == 1)
        #expect(value("voipserver_connections_accepted", "voipserver_connections_accepted_total", ["transport": "tls"]) == 1)
        #expect(value("voipserver_tls_handshakes", "voipserver_tls_handshakes_total", ["result": "full"]) == 1)
        #expect(value("voipserver_tls_handshakes", "voipserver_tls_handshakes_total", ["result": "failed"]) == 0)
        #expect(value("voipserver_tls_handshake_failures", "voipserver_tls_handshake_failures_total", ["reason": "not_tls"]) == 0)
        let expiry = try #require(families["voipserver_tls_certificate_expiry_timestamp_seconds"]?.samples.first?.value)
        #expect(expiry > Date().timeIntervalSince1970 && expiry < Date().timeIntervalSince1970 + 2 * 86_400)
    }

    @Test("a session resumes after a server restart: the ticket key is kept in the data directory (mode 0600); another key means a full handshake")
    func resumesAfterRestart() throws {
        let certificates = try TestCertificates()
        let data = try TemporaryDirectory("tls-restart")
        let options = ["--listen", "off", "--data-dir", data.path] + tlsOptions(certificates)
        var tls = try TestTLS(caFile: certificates.caFile)
        do {
            let first = try ServerProcess(options)
            let client = try TestClient(port: try #require(first.tlsPort), tls: tls)
            try client.hello(user: "alice")  // the ticket came before the WELCOME
            #expect(client.tls?.connection.resumedSession == false)
            tls.session = try #require(client.tls?.connection.resumableSession(), "no session ticket arrived")
            #expect(first.terminate().map { ($0 >> 8) & 0xff } == 0)
        }
        var status = stat()
        #expect(stat(data.file(TicketKeySource.fileName), &status) == 0 && status.st_mode & 0o777 == 0o600)

        let restarted = try ServerProcess(options)
        let again = try TestClient(port: try #require(restarted.tlsPort), tls: tls)
        #expect(again.tls?.connection.resumedSession == true, "the restarted server did not resume the session")
        try again.hello(user: "alice")

        // A server with another key (another data directory) cannot read the ticket.
        let stranger = try ServerProcess(["--listen", "off", "--store", "memory"] + tlsOptions(certificates))
        let full = try TestClient(port: try #require(stranger.tlsPort), tls: tls)
        #expect(full.tls?.connection.resumedSession == false)
    }

    @Test("SIGHUP reloads the certificate: the open TLS connection keeps working, a new one gets the new certificate")
    func sighupReloadsTheCertificate() throws {
        let certificates = try TestCertificates()
        let second = try certificates.makeServer(named: "localhost", addresses: ["127.0.0.1"], file: "second")
        let scratch = try TemporaryDirectory("tls-sighup")
        let chain = scratch.file("chain.pem"), key = scratch.file("key.pem")
        #expect(writeFile(chain, readTextFile(certificates.serverChainFile) ?? "") && writeFile(key, readTextFile(certificates.serverKeyFile) ?? ""))
        let server = try ServerProcess(["--listen", "off", "--store", "memory"] + tlsOptions(certificates, chain: chain, key: key))
        let tlsPort = try #require(server.tlsPort)
        let tls = try TestTLS(caFile: certificates.caFile)
        func hash(_ client: TestClient) -> String? {
            client.tls?.connection.peerPublicKeySHA256?.map { String(format: "%02x", $0) }.joined()
        }
        let old = try TestClient(port: tlsPort, tls: tls)
        try old.hello(user: "alice")
        #expect(hash(old) == (try certificates.publicKeySHA256(ofCertificate: certificates.serverChainFile)))

        #expect(writeFile(chain, readTextFile(second.chain) ?? "") && writeFile(key, readTextFile(second.key) ?? ""))
        server.process.send(signal: SIGHUP)
        let deadline = SystemClock().now() + .seconds(20)
        while !server.log.contains("event=reloaded changed=tls-cert,tls-key") {
            guard SystemClock().now() < deadline else { Issue.record("no reload: \(server.log)"); return }
            usleep(5_000)
        }
        let new = try TestClient(port: tlsPort, tls: tls)
        #expect(hash(new) == (try certificates.publicKeySHA256(ofCertificate: second.chain)))
        try new.hello(user: "bob")
        try old.send(.ping)
        #expect(try old.next() == .pong)
        #expect(server.process.poll() == nil)
    }

    @Test(
        "through a real haproxy (TCP mode, send-proxy-v2) in front of the TLS listener, the cap and the logs see each device's own address",
        .enabled(if: HAProxy.isAvailable, HAProxy.missingReason))
    func tlsThroughHAProxy() throws {
        let certificates = try TestCertificates()
        let log = LogFile(level: .debug)
        let server = try TestServer(logger: log.logger) { configuration in
            TestServer.tls(certificates, &configuration)
            configuration.tls?.proxyProtocol = true
            configuration.maxConnectionsPerAddress = 1
        }
        let haproxy = try HAProxy(forwardingTo: server.tlsPort)
        let tls = try TestTLS(caFile: certificates.caFile)
        let first: TestClient
        do {
            first = try TestClient(port: haproxy.port, sourceAddress: "127.0.0.5", tls: tls)
            try first.hello(user: "alice")
        } catch {
            Issue.record("\(error); \(haproxy.diagnostics)")
            return
        }
        // Same device address: over the cap, refused before any TLS work.
        #expect(throws: TestClient.Failure.self) { try TestClient(port: haproxy.port, sourceAddress: "127.0.0.5", tls: tls) }
        let other = try TestClient(port: haproxy.port, sourceAddress: "127.0.0.6", tls: tls)
        try other.hello(user: "carol")
        #expect(server.server.statistics.connectionsRefusedPerAddress == 1)
        let sessions = log.lines("session")
        #expect(sessions.contains { $0.contains("user=alice") && $0.contains("peer=127.0.0.5:") }, "\(sessions)")
        #expect(sessions.contains { $0.contains("user=carol") && $0.contains("peer=127.0.0.6:") }, "\(sessions)")
        #expect(try other.request(1, .messageSend(OutgoingMessage(
            messageID: "m1", recipient: "alice", contentType: "text/plain", body: Array("hi".utf8)))).isOK)
        guard case .message = try first.nextEvent().event else { Issue.record("no message through haproxy"); return }
        #expect(log.lines("proxy_header_invalid").isEmpty)
    }
}
