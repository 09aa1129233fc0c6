import SignalingCrypto
import SignalingProtocol
import SignalingServer
import SignalingSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// `--proxy-protocol`: behind a load balancer every connection starts with a PROXY v2
/// header, and the server counts, limits and logs the device's address it names instead
/// of the balancer's.
@Suite("PROXY protocol on the device listener")
struct ProxyProtocolTests {
    private func proxiedServer(logger: Logger = .silent, _ configure: (inout ServerConfiguration) -> Void = { _ in }) throws -> TestServer {
        try TestServer(logger: logger) { configuration in
            configuration.proxyProtocol = true
            configure(&configuration)
        }
    }

    /// A connection from this host (the "balancer") that announces `header` first.
    private func connect(_ server: TestServer, _ header: [UInt8]) throws -> TestClient {
        let client = try server.client()
        try client.sendRaw(header)
        return client
    }

    @Test("the per-address cap counts the address in the header, not the balancer's, and closing frees its place")
    func capCountsTheHeaderAddress() throws {
        let server = try proxiedServer { $0.maxConnectionsPerAddress = 1 }
        let first = try connect(server, ProxyHeaderBytes.ipv4("198.51.100.1", port: 40001))
        try first.hello(user: "a")
        let second = try connect(server, ProxyHeaderBytes.ipv4("198.51.100.1", port: 40002))
        let close = try second.expectClose()
        #expect(close.code == .tooManyConnections)
        #expect(close.message.contains("more than 1 connections"))
        // Same socket address (127.0.0.1), another device address: admitted.
        let other = try connect(server, ProxyHeaderBytes.ipv4("198.51.100.2", port: 40003))
        try other.hello(user: "b")
        let ipv6 = try connect(server, ProxyHeaderBytes.ipv6(last: 9, port: 40004))
        try ipv6.hello(user: "c")
        #expect(server.server.statistics.connectionsRefusedPerAddress == 1)
        // The place is given back under the header's address when the device goes.
        _ = consume second
        _ = consume first
        try server.waitFor("the closes to be counted") { $0.openConnections == 2 }
        try connect(server, ProxyHeaderBytes.ipv4("198.51.100.1", port: 40005)).hello(user: "a")
    }

    @Test("a header split across reads is put together, and the HELLO right behind it is handled")
    func splitHeader() throws {
        let server = try proxiedServer()
        let client = try server.client()
        let header = ProxyHeaderBytes.ipv4("198.51.100.7", port: 5000)
        for piece in [header[..<1], header[1..<13], header[13..<17], header[17...]] {
            try client.sendRaw(Array(piece))
            // Nothing is refused while the header is merely incomplete.
            #expect(try client.staysSilent(for: .milliseconds(30)))
        }
        try client.hello(user: "alice")
        // Header and HELLO in one write.
        let together = try server.client()
        try together.sendRaw(ProxyHeaderBytes.ipv4("198.51.100.8", port: 5001) + FrameEncoder.encode(.hello(Hello(userID: "bob", deviceID: "d"))))
        guard case .welcome? = try together.next() else { Issue.record("no WELCOME"); return }
    }

    @Test("LOCAL (the balancer's health check) is accepted and keeps the socket's own address")
    func localKeepsSocketAddress() throws {
        let server = try proxiedServer { $0.maxConnectionsPerAddress = 1 }
        let check = try connect(server, ProxyHeaderBytes.local)
        try check.hello(user: "health")
        // A second one counts under the same socket address, 127.0.0.1.
        #expect(try connect(server, ProxyHeaderBytes.local).expectClose().code == .tooManyConnections)
        try connect(server, ProxyHeaderBytes.ipv4("198.51.100.3", port: 1)).hello(user: "device")
    }

    @Test("a connection that does not start with a header gets CLOSE malformedFrame advising a slow retry, and a warn line naming its address")
    func missingHeader() throws {
        let log = LogFile()
        let server = try proxiedServer(logger: log.logger)
        let client = try server.client()
        try client.send(.hello(Hello(userID: "alice", deviceID: "d")))
        let close = try client.expectClose()
        #expect(close.code == .malformedFrame)
        #expect(close.message.contains("PROXY protocol version 2"))
        // The balancer relays this to a device that did nothing wrong: it comes back later.
        #expect(close.action == .resume && close.retryAfterMs == 30_000 && close.retryJitterMs == 30_000)
        let lines = log.lines("proxy_header_invalid")
        #expect(lines.count == 1 && lines[0].contains("level=warn") && lines[0].contains("peer=127.0.0.1:"), "\(lines)")
        // Version 1 (haproxy's send-proxy) is named as such.
        let textual = try connect(server, Array("PROXY TCP4 198.51.100.1 10.0.0.1 1 2\r\n".utf8))
        #expect(try textual.expectClose().message.contains("version 1"))
    }

    @Test("a header that does not arrive within the handshake timeout closes the connection")
    func headerTimeout() throws {
        let server = try proxiedServer { $0.handshakeTimeout = .seconds(3) }
        let client = try connect(server, Array(ProxyHeaderBytes.local[..<5]))
        // The deadline counts from the accept: the clock moves only once the server has it.
        try server.waitFor("the connection to be accepted") { $0.openConnections == 1 }
        #expect(try client.staysSilent(for: .milliseconds(30)))
        try server.advance(by: .seconds(3))
        let close = try client.expectClose()
        #expect(close.code == .handshakeTimeout)
        #expect(close.message == "no PROXY header within 3 s")
        #expect(server.server.statistics.handshakeTimeouts == 1)
    }

    @Test("the session and auth_failed lines carry the device's address from the header")
    func logsShowTheDeviceAddress() throws {
        let log = LogFile(level: .debug)
        let server = try proxiedServer(logger: log.logger) { $0.authSecret = "secret" }
        try connect(server, ProxyHeaderBytes.ipv4("203.0.113.20", port: 6000))
            .hello(user: "alice", credentials: LegacyToken.make(secret: "secret", userID: "alice"))
        let sessions = log.lines("session")
        #expect(sessions.count == 1 && sessions[0].contains("peer=203.0.113.20:6000"), "\(sessions)")
        let refused = try connect(server, ProxyHeaderBytes.ipv6(last: 0x21, port: 6001))
        try refused.send(.hello(Hello(userID: "mallory", deviceID: "d", credentials: Array(repeating: 0x30, count: 64))))
        #expect(try refused.expectClose().code == .unauthorized)
        let failures = log.lines("auth_failed")
        #expect(failures.count == 1 && failures[0].contains("peer=[2001:db8::21]:6001"), "\(failures)")
    }

    @Test("without --proxy-protocol the session line carries the socket's address")
    func logsShowTheSocketAddress() throws {
        let log = LogFile(level: .debug)
        let server = try TestServer(logger: log.logger)
        try server.client(sourceAddress: "127.0.0.3").hello(user: "alice")
        let sessions = log.lines("session")
        #expect(sessions.count == 1 && sessions[0].contains("peer=127.0.0.3:"), "\(sessions)")
    }

    @Test("--proxy-protocol and the file's proxy-protocol = true turn it on; it is off by default")
    func option() throws {
        #expect(try ServerOptions.configuration(from: []).0.proxyProtocol == false)
        #expect(try ServerOptions.configuration(from: ["--proxy-protocol"]).0.proxyProtocol == true)
        let path = "/tmp/voipserver-proxy-\(UInt32.random(in: 0...UInt32.max)).conf"
        #expect(writeFile(path, "proxy-protocol = true\n"))
        defer { removeFile(path) }
        #expect(try ServerOptions.configuration(from: ["--config", path]).0.proxyProtocol == true)
    }

    @Test(
        "through a real haproxy with send-proxy-v2, the cap applies to each device's own address",
        .enabled(if: HAProxy.isAvailable, HAProxy.missingReason))
    func throughHAProxy() throws {
        let log = LogFile(level: .debug)
        let server = try proxiedServer(logger: log.logger) { $0.maxConnectionsPerAddress = 1 }
        // Its health checks too, as in production: they carry a LOCAL header.
        let haproxy = try HAProxy(forwardingTo: server.port, serverOptions: "check inter 100ms")
        // Every connection reaches the server from haproxy's 127.0.0.1.
        let first = try TestClient(port: haproxy.port, sourceAddress: "127.0.0.5")
        do {
            try first.hello(user: "alice")
        } catch {
            Issue.record("\(error); \(haproxy.diagnostics)")
            return
        }
        let second = try TestClient(port: haproxy.port, sourceAddress: "127.0.0.5")
        try second.send(.hello(Hello(userID: "bob", deviceID: "d")))
        #expect(try second.expectClose().code == .tooManyConnections)
        let other = try TestClient(port: haproxy.port, sourceAddress: "127.0.0.6")
        try other.hello(user: "carol")
        #expect(server.server.statistics.connectionsRefusedPerAddress == 1)
        let sessions = log.lines("session")
        #expect(sessions.count == 2, "\(sessions)")
        #expect(sessions.contains { $0.contains("user=alice") && $0.contains("peer=127.0.0.5:") }, "\(sessions)")
        #expect(sessions.contains { $0.contains("user=carol") && $0.contains("peer=127.0.0.6:") }, "\(sessions)")
        // Events flow through the balancer as they do directly.
        #expect(try other.request(1, .messageSend(OutgoingMessage(
            messageID: "m1", recipient: "alice", contentType: "text/plain", body: Array("hi".utf8)))).isOK)
        guard case .message(let message) = try first.nextEvent().event else { Issue.record("no message"); return }
        #expect(message.body == Array("hi".utf8))
        // A health check is a connection beyond the two devices', accepted and never refused.
        try server.waitFor("a health check") { $0.acceptedConnections >= 3 }
        #expect(log.lines("proxy_header_invalid").isEmpty, "\(haproxy.diagnostics)")
    }
}
