import Foundation
import SignalingProtocol
@testable import SignalingServer
import SignalingSupport
import SignalingTLS
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// The TLS device listener on the server's own loops, with real sockets: the handshake,
/// frames through OpenSSL, partial writes, back-pressure, closes, reloads, PROXY headers,
/// and what a bad client costs (its own connection only).
@Suite("TLS on the device listener")
struct TLSListenerTests {
    /// A server with both listeners: plain on `port`, TLS on `tlsPort`.
    private func server(
        _ certificates: TestCertificates, logger: Logger = .silent, _ configure: (inout ServerConfiguration) -> Void = { _ in }
    ) throws -> TestServer {
        try TestServer(logger: logger) { configuration in
            TestServer.tls(certificates, &configuration)
            configure(&configuration)
        }
    }

    private func message(_ id: String, to recipient: String, _ text: String) -> Request {
        .messageSend(OutgoingMessage(messageID: id, recipient: recipient, contentType: "text/plain", body: Array(text.utf8)))
    }

    @Test("a TLS device does HELLO/WELCOME, a call and messages with a plain device, over TLS 1.3 with ALPN vsig/1")
    func callAndMessageOverTLS() throws {
        let certificates = try TestCertificates()
        let server = try server(certificates)
        let alice = try server.tlsClient(certificates)
        #expect(alice.tls?.connection.version == .v1_3)
        #expect(alice.tls?.connection.alpn == "vsig/1")
        try alice.hello(user: "alice")
        let (bob, _) = try server.connect(user: "bob")

        let offer = Array("v=0 offer".utf8), answer = Array("v=0 answer".utf8)
        #expect(try alice.request(1, .callInvite(callID: "c1", callee: "bob", offer: offer)).isOK)
        guard case .callIncoming("c1", "alice", _, offer, _) = try bob.nextEvent().event else { Issue.record("no call for bob"); return }
        #expect(try bob.request(1, .callAccept(callID: "c1", answer: answer)).isOK)
        #expect(try alice.nextEvent().event == .callAccepted(callID: "c1", device: "d1", answer: answer))

        #expect(try bob.request(2, message("m1", to: "alice", "over TLS")).isOK)
        let (seq, event) = try alice.nextEvent()
        guard case .message(let received) = event else { Issue.record("no message for alice"); return }
        #expect(received.body == Array("over TLS".utf8))
        try alice.ack(seq)
        #expect(try alice.request(2, message("m2", to: "bob", "back")).isOK)
        // Bob first hears that alice received m1, then gets m2.
        #expect(try bob.nextEvent().event == .messageDelivered(messageID: "m1", recipient: "alice", recipientDevice: "d1", serverTime: server.clock.wallMilliseconds()))
        guard case .message(let back) = try bob.nextEvent().event, back.messageID == "m2" else { Issue.record("no message for bob"); return }

        let statistics = server.server.statistics
        #expect(statistics.openTLSConnections == 1 && statistics.establishedTLSConnections == 1)
        #expect(statistics.acceptedTLSConnections == 1 && statistics.tlsHandshakesFull == 1)
        #expect(statistics.establishedConnections == 2)
    }

    @Test("a 5 MB backlog reaches a TLS device through a small receive window whole (partial TLS writes), acknowledged at the end")
    func largeBacklogOverTLS() throws {
        let certificates = try TestCertificates()
        let server = try server(certificates)
        let count = 5_000_000 / LargeMessages.size + 1
        do { try server.tlsClient(certificates).hello(user: "bob") }  // bob has a device, now offline
        try server.waitFor("bob to go") { $0.establishedConnections == 0 }
        let (alice, _) = try server.connect(user: "alice")
        for index in 1...count { try alice.send(.request(id: UInt32(index), LargeMessages.request(index, to: "bob"))) }
        for index in 1...count { #expect(try alice.reply(to: UInt32(index), timeout: .seconds(30)).isOK) }

        let bob = try server.tlsClient(certificates, receiveWindow: 16_384)
        try bob.hello(user: "bob")
        let last = try bob.receiveLargeMessages(count: count)
        try bob.ack(last)
        for _ in 1...count { guard case .messageDelivered = try alice.nextEvent(timeout: .seconds(30)).event else { return } }
        try bob.send(.ping)
        #expect(try bob.next() == .pong)
        let statistics = server.server.statistics
        #expect(statistics.slowConsumerCloses == 0)
        #expect(statistics.largestOutbound > 0, "the socket never refused a write: no partial write was exercised")
        #expect(statistics.largestOutbound <= EventLoop.pumpBytes + LargeMessages.size + 1024)
    }

    @Test("a TLS client that reads nothing is held back by TCP, then closed with CLOSE slowConsumer after the frame in progress")
    func slowConsumerOverTLS() throws {
        let certificates = try TestCertificates()
        let server = try server(certificates) {
            $0.maxFrameLength = 1024
            $0.maxQueuedBytes = 4096
            $0.slowConsumerTimeout = .seconds(30)
        }
        let reader = try TestClient(port: server.tlsPort, receiveWindow: 4096, tls: TestTLS(caFile: certificates.caFile))
        try reader.hello(user: "bob")
        try reader.sendUntilBlocked((0..<2000).flatMap { _ in FrameEncoder.encode(.ping) })
        #expect(server.server.statistics.largestOutbound <= 4096 + EventLoop.tlsMaximumRecord + 1024)
        try server.advance(by: .seconds(30))
        #expect(server.server.statistics.slowConsumerCloses == 0, "closed before the timeout")
        try server.advance(by: .seconds(31), until: "the slow consumer's close") { $0.slowConsumerCloses == 1 }
        // PONGs it had not read, then CLOSE, then close_notify: the TLS stream ends cleanly.
        let close = try reader.expectClose(timeout: .seconds(10))
        #expect(close.code == .slowConsumer)
        #expect(BackpressureTests.stalledSeconds(close).map { $0 > 30 } == true, "closed before the timeout: \(close.message)")
    }

    @Test("a server-initiated close sends CLOSE inside TLS, then close_notify, and the stream ends cleanly")
    func closeOverTLS() throws {
        let certificates = try TestCertificates()
        let server = try server(certificates)
        let first = try server.tlsClient(certificates)
        try first.hello(user: "alice", device: "phone")
        let second = try server.tlsClient(certificates)
        try second.hello(user: "alice", device: "phone")
        let close = try first.expectClose()  // a clean end (close_notify), not a reset
        #expect(close.code == .replaced)
        try second.send(.ping)
        #expect(try second.next() == .pong)
    }

    @Test("a client that never sends a ClientHello is closed at the handshake deadline, counted as a TLS timeout")
    func silentClientTimesOut() throws {
        let certificates = try TestCertificates()
        let log = LogFile(level: .debug)
        let server = try server(certificates, logger: log.logger) { $0.handshakeTimeout = .seconds(3) }
        let silent = try TestClient(port: server.tlsPort)
        // The deadline counts from the accept: the clock moves only once the server has it.
        try server.waitFor("the connection to be accepted") { $0.openConnections == 1 }
        try server.advance(by: .seconds(2))
        #expect(silent.isOpenAndQuiet, "closed before the deadline")
        try server.advance(by: .seconds(1))
        // No TLS session, so no CLOSE: the connection just ends.
        #expect(try silent.next(timeout: .seconds(5)) == nil)
        let statistics = server.server.statistics
        #expect(statistics.handshakeTimeouts == 1 && statistics.tlsHandshakesFailed == 1)
        #expect(log.lines("close").contains { $0.contains("no TLS handshake within 3 s") }, "\(log.lines("close"))")
    }

    @Test("garbage instead of a ClientHello closes that connection with an alert, and nothing else")
    func garbageClosesOnlyItsConnection() throws {
        let certificates = try TestCertificates()
        let log = LogFile()
        let server = try server(certificates, logger: log.logger)
        let device = try server.tlsClient(certificates)
        try device.hello(user: "alice")
        let (plain, _) = try server.connect(user: "bob")

        for garbage in ["GET / HTTP/1.1\r\nHost: x\r\n\r\n", String(repeating: "\u{16}\u{03}\u{01}\u{ff}\u{ff}", count: 20)] {
            let scanner = try TestClient(port: server.tlsPort)
            try scanner.sendRaw(Array(garbage.utf8))
            #expect(try readUntilEnd(scanner.fd).count < 100, "more than an alert came back")
        }
        // The VSIG protocol in clear on the TLS port: refused the same way.
        let confused = try TestClient(port: server.tlsPort)
        try confused.sendRaw(FrameEncoder.encode(.hello(Hello(userID: "carol", deviceID: "d"))))
        _ = try readUntilEnd(confused.fd)

        try server.waitFor("three failed handshakes") { $0.tlsHandshakesFailed == 3 }
        try device.send(.ping)
        #expect(try device.next() == .pong)
        #expect(try plain.request(1, message("m1", to: "alice", "still here")).isOK)
        guard case .message = try device.nextEvent().event else { Issue.record("alice lost her message"); return }
        let failures = log.lines("tls_handshake_failed")
        #expect(failures.first?.contains("reason=not_tls") == true && failures.first?.contains("level=info") == true, "\(failures)")
        #expect(failures.count < 3, "one line a second at most: \(failures)")
    }

    @Test("a client offering only another ALPN protocol is refused; one offering none is served")
    func alpn() throws {
        let certificates = try TestCertificates()
        let server = try server(certificates)
        #expect(throws: TestClient.Failure.self) {
            try TestClient(port: server.tlsPort, tls: TestTLS(caFile: certificates.caFile, alpn: "h2"))
        }
        let none = try TestClient(port: server.tlsPort, tls: TestTLS(caFile: certificates.caFile, alpn: nil))
        try none.hello(user: "alice")
        try server.waitFor("the ALPN failure to be counted") { $0.tlsHandshakesFailed == 1 }
    }

    @Test("a certificate reload keeps open TLS connections working and gives new ones the new certificate; a bad one keeps the running certificate")
    func reloadUnderLiveConnections() throws {
        let certificates = try TestCertificates()
        let second = try certificates.makeServer(named: "localhost", addresses: ["127.0.0.1"], file: "second")
        let scratch = try TemporaryDirectory("tls-reload")
        let chain = scratch.file("chain.pem"), key = scratch.file("key.pem")
        func install(_ files: (chain: String, key: String)) {
            #expect(writeFile(chain, readTextFile(files.chain) ?? "") && writeFile(key, readTextFile(files.key) ?? ""))
        }
        install((certificates.serverChainFile, certificates.serverKeyFile))
        let log = LogFile()
        let server = try server(certificates, logger: log.logger) {
            $0.tls?.certificateChainFile = chain
            $0.tls?.privateKeyFile = key
        }
        let firstHash = try certificates.publicKeySHA256(ofCertificate: certificates.serverChainFile)
        let secondHash = try certificates.publicKeySHA256(ofCertificate: second.chain)
        func hex(_ client: TestClient) -> String? {
            client.tls?.connection.peerPublicKeySHA256?.map { String(format: "%02x", $0) }.joined()
        }
        let old = try server.tlsClient(certificates)
        try old.hello(user: "alice")
        #expect(hex(old) == firstHash)

        install(second)
        let reload = server.server.reload(server.server.configuration)
        #expect(reload.applied.contains("tls-cert") && reload.applied.contains("tls-key"), "\(reload)")
        let new = try server.tlsClient(certificates)
        try new.hello(user: "bob")
        #expect(hex(new) == secondHash)
        // The connection made before the reload goes on, both ways.
        #expect(try new.request(1, message("m1", to: "alice", "after the reload")).isOK)
        guard case .message = try old.nextEvent().event else { Issue.record("the old connection lost a message"); return }
        #expect(try old.request(1, message("m2", to: "bob", "from before")).isOK)
        guard case .message = try new.nextEvent().event else { Issue.record("no message from the old connection"); return }

        #expect(writeFile(chain, "not a certificate\n"))
        let refused = server.server.reload(server.server.configuration)
        #expect(!refused.applied.contains("tls-cert"), "\(refused)")
        #expect(log.lines("reload_refused").contains { $0.contains("level=error") && $0.contains(chain) }, "\(log.lines("reload_refused"))")
        let later = try server.tlsClient(certificates)
        #expect(hex(later) == secondHash, "a bad certificate replaced the running one")
        try later.hello(user: "carol")
        #expect(log.lines("tls_certificate").count == 2)
    }

    @Test("a PROXY header before the TLS handshake: the cap and the logs use its address; a bad one ends the connection before any TLS")
    func proxyHeaderBeforeTLS() throws {
        let certificates = try TestCertificates()
        let log = LogFile(level: .debug)
        let server = try server(certificates, logger: log.logger) {
            $0.tls?.proxyProtocol = true
            $0.maxConnectionsPerAddress = 1
        }
        let tls = try TestTLS(caFile: certificates.caFile)
        let first = try TestClient(port: server.tlsPort, proxyHeader: ProxyHeaderBytes.ipv4("198.51.100.1", port: 40001), tls: tls)
        try first.hello(user: "alice")
        // Over the cap: refused at the header, before any handshake work.
        #expect(throws: TestClient.Failure.self) {
            try TestClient(port: server.tlsPort, proxyHeader: ProxyHeaderBytes.ipv4("198.51.100.1", port: 40002), tls: tls)
        }
        // The header split in two, the ClientHello right behind it.
        let split = try TestClient(port: server.tlsPort, proxyHeader: Array(ProxyHeaderBytes.ipv4("198.51.100.2", port: 40003)[..<10]))
        try split.sendRaw(Array(ProxyHeaderBytes.ipv4("198.51.100.2", port: 40003)[10...]))
        #expect(try split.staysSilent(for: .milliseconds(30)))
        // No header at all: a ClientHello where the header belongs.
        #expect(throws: TestClient.Failure.self) { try TestClient(port: server.tlsPort, tls: tls) }
        #expect(server.server.statistics.connectionsRefusedPerAddress == 1)
        #expect(log.lines("session").contains { $0.contains("user=alice") && $0.contains("peer=198.51.100.1:40001") }, "\(log.lines("session"))")
        #expect(log.lines("proxy_header_invalid").count == 1)
        // The plain listener takes no header (--proxy-protocol is off).
        try server.connect(user: "bob").0.send(.ping)
    }

    @Test("the TLS options: TLS-only, both listeners, and the mistakes refused")
    func options() throws {
        func parse(_ arguments: [String]) throws -> ServerConfiguration { try ServerOptions.configuration(from: arguments).0 }
        let files = ["--tls-cert", "/c.pem", "--tls-key", "/k.pem"]
        let tlsOnly = try parse(["--tls-listen", "127.0.0.1:8443"] + files)
        #expect(!tlsOnly.plainListener && tlsOnly.tls?.port == 8443 && tlsOnly.tls?.minimumVersion == .v1_3)
        #expect(tlsOnly.tls?.ticketKey == .dataDirectory(tlsOnly.storage.directory + "/tls-ticket-key"))
        let both = try parse(["--listen", "127.0.0.1:7443", "--tls-listen", "127.0.0.1:8443", "--tls-min-version", "1.2", "--store", "memory"] + files)
        #expect(both.plainListener && both.port == 7443 && both.tls?.minimumVersion == .v1_2 && both.tls?.ticketKey == .perProcess)
        let explicit = try parse(["--listen", "off", "--tls-listen", "127.0.0.1:8443", "--tls-ticket-key-file", "/t", "--tls-proxy-protocol"] + files)
        #expect(!explicit.plainListener && explicit.tls?.ticketKey == .file("/t") && explicit.tls?.proxyProtocol == true)
        #expect(try parse([]).tls == nil && parse([]).plainListener)

        for (arguments, complaint) in [
            (["--listen", "off"], "no listener"),
            (["--tls-cert", "/c.pem"], "--tls-cert needs --tls-listen"),
            (["--tls-listen", "127.0.0.1:8443"], "--tls-cert and --tls-key"),
            (["--tls-listen", "127.0.0.1:8443", "--tls-min-version", "1.1"] + files, "1.2 or 1.3"),
            (["--tls-listen", "0.0.0.0:8443"] + files, "--tls-listen 0.0.0.0 without authentication"),
            (["--tls-listen", "127.0.0.1:8443", "--proxy-protocol"] + files, "--tls-proxy-protocol"),
        ] {
            do {
                _ = try parse(arguments)
                Issue.record("\(arguments) was accepted")
            } catch {
                #expect("\(error)".contains(complaint), "\(arguments): \(error)")
            }
        }
        // The safe default covers the TLS listener: open to the network with an explicit choice.
        #expect(try parse(["--tls-listen", "0.0.0.0:8443", "--allow-anonymous"] + files).tls?.host == "0.0.0.0")
    }
}

/// Reads raw bytes until the peer closes (or resets) the connection; throws if it stays
/// open for 5 s.
func readUntilEnd(_ fd: Int32) throws -> [UInt8] {
    var received: [UInt8] = []
    let deadline = SystemClock().now() + .seconds(5)
    var chunk = [UInt8](repeating: 0, count: 4096)
    while SystemClock().now() < deadline {
        var descriptor = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        guard poll(&descriptor, 1, 100) > 0 else { continue }
        let count = recv(fd, &chunk, chunk.count, 0)
        if count == 0 || (count < 0 && errno == ECONNRESET) { return received }
        if count < 0 { if errno == EINTR || errno == EAGAIN { continue } else { return received } }
        received += chunk[..<count]
    }
    throw TestClient.Failure("the connection stayed open")
}
