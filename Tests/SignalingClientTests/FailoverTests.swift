import Foundation
import Synchronization
import Testing
import SignalingProtocol
import SignalingServer
import SignalingSupport
import TestSupport
#if canImport(Glibc)
import Glibc
#endif
@testable import SignalingClient

/// Several servers: real servers on ephemeral loopback ports (in process, or `voipserver`
/// subprocesses for kill -9), a bound port nobody listens on for a server that is down,
/// and an injected resolver for a name with several addresses.
@Suite("Failover over several servers")
struct FailoverTests {
    static func loopback(_ port: UInt16) -> SocketAddress {
        SocketAddress(family: AF_INET, addressBytes: [127, 0, 0, 1], port: port)!
    }

    /// A resolver for made-up names that records every question, in order.
    final class ScriptedResolver: Sendable {
        let answers: [String: [SocketAddress]]
        private let asked = Mutex<[String]>([])
        init(_ answers: [String: [SocketAddress]]) { self.answers = answers }
        var questions: [String] { asked.withLock { $0 } }
        var resolver: HostResolver {
            { (host, _) throws(ConnectError) in
                self.asked.withLock { $0.append(host) }
                guard let addresses = self.answers[host] else { throw .resolutionFailed(host: host, reason: "unknown test name") }
                return addresses
            }
        }
    }

    /// A client of the named servers (port 7443 each), resolved by `names`.
    static func client(servers: [String], _ names: ScriptedResolver) throws -> TestClient {
        try TestClient(port: 7443, host: servers[0]) { configuration in
            configuration.servers = servers.map { ServerEndpoint(host: $0, port: 7443) }
            configuration.resolver = names.resolver
        }
    }

    static func isConnected(to port: UInt16) -> (ClientEvent) -> Bool {
        { if case .connectionStateChanged(.connected(let info)) = $0 { return info.remoteAddress.port == port } else { return false } }
    }

    @Test("the first server down (nobody listens): connect goes on to the second and remembers which one answered")
    func firstServerDown() throws {
        let down = try ReservedPort()
        let live = try RealServer()
        let test = try TestClient(port: down.port) { configuration in
            configuration.servers.append(ServerEndpoint(host: "127.0.0.1", port: live.port))
        }
        defer { test.client.shutdown() }
        let info = try test.connectAndSettle()
        #expect(info.remoteAddress.port == live.port)
        #expect(info.server == ServerEndpoint(host: "127.0.0.1", port: live.port))
        #expect(test.core.queue.sync { test.core.preferredServer } == 1)
    }

    @Test("a name resolving to several addresses is tried address by address, and a name that does not resolve is passed over")
    func severalAddresses() throws {
        let down = try ReservedPort()
        let live = try RealServer()
        let names = ScriptedResolver(["nodes.test": [Self.loopback(down.port), Self.loopback(live.port)]])
        let test = try TestClient(port: 7443, host: "missing.test") { configuration in
            configuration.servers.append(ServerEndpoint(host: "nodes.test", port: 7443))
            configuration.resolver = names.resolver
        }
        defer { test.client.shutdown() }
        let info = try test.connectAndSettle()
        #expect(info.remoteAddress == Self.loopback(live.port))
        #expect(info.server?.host == "nodes.test")
        #expect(names.questions == ["missing.test", "nodes.test"])
    }

    @Test("a server that takes the TCP connection but never answers HELLO costs its share of the deadline, not the whole connect: the next server is reached in time")
    func silentServer() throws {
        let silent = try ScriptedServer()   // the kernel completes the TCP handshake; nobody reads
        let live = try RealServer()
        let test = try TestClient(port: silent.port) { configuration in
            configuration.servers.append(ServerEndpoint(host: "127.0.0.1", port: live.port))
        }
        defer { test.client.shutdown() }
        // 4 s over two servers: the silent one gets 2 s, the live one the rest.
        let info = try test.client.connect(timeout: .seconds(4))
        #expect(info.remoteAddress.port == live.port)
    }

    @Test("TLS: a node whose certificate is rejected is passed over, and each server is checked against its own name")
    func tlsPerServer() throws {
        let trusted = try TestCertificates(), untrusted = try TestCertificates()
        // Node B's certificate names only node-b.test (no IP entry): dialled by address, it
        // verifies only when that server's tlsServerName is the name checked.
        let nodeB = try trusted.makeServer(named: "node-b.test", file: "node-b")
        let a = try ServerProcess(["--tls-listen", "127.0.0.1:0", "--tls-cert", untrusted.serverChainFile,
                                   "--tls-key", untrusted.serverKeyFile, "--store", "memory", "--workers", "1"])
        let b = try ServerProcess(["--tls-listen", "127.0.0.1:0", "--tls-cert", nodeB.chain, "--tls-key", nodeB.key,
                                   "--store", "memory", "--workers", "1"])
        let aPort = try #require(a.tlsPort), bPort = try #require(b.tlsPort)
        let test = try TestClient(port: aPort) { configuration in
            configuration.servers.append(ServerEndpoint(host: "127.0.0.1", port: bPort, tlsServerName: "node-b.test"))
            configuration.tls = ClientTLSConfiguration(caFile: trusted.caFile)
        }
        defer { test.client.shutdown() }
        let info = try test.connectAndSettle()
        #expect(info.remoteAddress.port == bPort)
        #expect(info.tls?.version == .v1_3)
    }

    @Test("every server down: one connect error for the list, then one back-off step per walk of the whole list, as for one server")
    func everyServerDown() throws {
        let first = try ReservedPort(), second = try ReservedPort()
        let names = ScriptedResolver(["a.test": [Self.loopback(first.port)], "b.test": [Self.loopback(second.port)]])
        let test = try Self.client(servers: ["a.test", "b.test"], names)
        defer { test.client.shutdown() }
        do {
            try test.client.connect(timeout: .seconds(5))
            Issue.record("connected with every server down")
        } catch {
            // The last server's failure is the one reported.
            #expect(error == .refused(Self.loopback(second.port)))
        }
        // Three walks: each tries both servers once, then waits the next back-off step
        // (ceilings 50, 100, 200 ms in TestClient's policy).
        #expect(test.recorder.wait { events in events.filter(\.isWaiting).count >= 3 })
        test.client.disconnect()
        let delays = test.recorder.all.compactMap { event -> Duration? in
            if case .connectionStateChanged(.waitingToReconnect(let delay, _)) = event { return delay } else { return nil }
        }
        #expect(delays.count >= 3 && delays[0] <= .milliseconds(50) && delays[1] <= .milliseconds(100) && delays[2] <= .milliseconds(200))
        #expect(Array(names.questions.prefix(6)) == ["a.test", "b.test", "a.test", "b.test", "a.test", "b.test"])
    }

    @Test("sticky: after a lost connection the server that last answered is tried first")
    func sticky() throws {
        let down = try ReservedPort()
        let live = try RealServer()
        let names = ScriptedResolver(["a.test": [Self.loopback(down.port)], "b.test": [Self.loopback(live.port)]])
        let test = try Self.client(servers: ["a.test", "b.test"], names)
        defer { test.client.shutdown() }
        try test.connectAndSettle()
        #expect(names.questions == ["a.test", "b.test"])
        let before = test.recorder.all.count
        test.core.queue.sync { test.core.currentConnection?.abort() }
        #expect(test.recorder.first(after: before, Self.isConnected(to: live.port)) != nil)
        #expect(names.questions == ["a.test", "b.test", "b.test"])
    }

    @Test("a server shutting down (CLOSE goingAway): after its advised delay the client connects to the next server, tried first")
    func goingAwayMovesOn() throws {
        let leaving = try RealServer { $0.drainRetryAfter = .milliseconds(100); $0.drainJitter = .milliseconds(100) }
        let staying = try RealServer()
        let resolver = ScriptedResolver(["a.test": [Self.loopback(leaving.port)], "b.test": [Self.loopback(staying.port)]])
        let test = try Self.client(servers: ["a.test", "b.test"], resolver)
        defer { test.client.shutdown() }
        let info = try test.connectAndSettle()
        #expect(info.remoteAddress.port == leaving.port)
        let before = test.recorder.all.count
        leaving.server.shutdown()
        let waiting = test.recorder.first(after: before) { $0.isWaiting }
        guard case .connectionStateChanged(.waitingToReconnect(let delay, .serverClosed(let close))) = waiting else {
            Issue.record("no wait after the CLOSE: \(String(describing: waiting))"); return
        }
        #expect(close.code == .goingAway)
        #expect(delay >= .milliseconds(100) && delay <= .milliseconds(200))
        #expect(test.recorder.first(after: before, Self.isConnected(to: staying.port)) != nil)
        // The leaving node was not tried again first.
        #expect(resolver.questions == ["a.test", "b.test"])
    }

    @Test("kill -9 of the connected voipserver: the client reconnects to another live one within its back-off, resumes there or handshakes afresh, and messages flow")
    func killedServer() throws {
        let first = try ServerProcess(["--store", "memory", "--workers", "1"])
        let second = try ServerProcess(["--store", "memory", "--workers", "1"])
        let alice = try TestClient(port: first.port, user: "alice", device: "phone") { configuration in
            configuration.servers.append(ServerEndpoint(host: "127.0.0.1", port: second.port))
        }
        defer { alice.client.shutdown() }
        let info = try alice.connectAndSettle()
        #expect(info.remoteAddress.port == first.port)
        let before = alice.recorder.all.count
        first.process.send(signal: SIGKILL)
        _ = first.process.waitForExit(timeoutSeconds: 10)
        guard case .connectionStateChanged(.connected(let moved)) = alice.recorder.first(after: before, Self.isConnected(to: second.port)) else {
            Issue.record("no reconnection to the second server: \(alice.recorder.all.dropFirst(before))"); return
        }
        // Independent servers: the second does not know the session and says so (a fresh
        // one); a cluster node would resume it.
        #expect(!moved.resumed && moved.sessionID != info.sessionID)
        // The back-off of a lost connection was used, not a CLOSE's advice.
        let waits = alice.recorder.all.dropFirst(before).compactMap { event -> Duration? in
            if case .connectionStateChanged(.waitingToReconnect(let delay, _)) = event { return delay } else { return nil }
        }
        #expect(!waits.isEmpty && waits.allSatisfy { $0 <= .milliseconds(400) })

        let bob = try TestClient(port: second.port, user: "bob", device: "phone")
        defer { bob.client.shutdown() }
        try bob.connectAndSettle()
        #expect(try bob.request { bob.client.send(to: "alice", body: Array("after failover".utf8), messageID: "f-1", completion: $0) }.isSuccess)
        #expect(alice.recorder.wait { _ in alice.recorder.messages.contains { $0.messageID == "f-1" } })
    }

    @Test("kill -9 of the active node of a Redis database: the client walks its list until the standby has taken over, resumes its session there, and gets every message once",
          .enabled(if: RedisServer.isAvailable, "redis-server is not installed"))
    func resumesOnTheStandbyAfterAKill() throws {
        let redis = try RedisServer()
        // A standby does not listen until it holds the lease, so its port is chosen here.
        let standbyPort = try unusedLoopbackPort()
        let node = ["--store", redis.url(), "--redis-lease-ttl", "2", "--workers", "1"]
        let active = try ServerProcess(node)
        let standby = try ServerProcess(node + ["--listen", "127.0.0.1:\(standbyPort)"], until: "standby")
        let both: (inout ClientConfiguration) -> Void = { $0.servers.append(ServerEndpoint(host: "127.0.0.1", port: standbyPort)) }
        let bob = try TestClient(port: active.port, user: "bob", device: "phone", configure: both)
        defer { bob.client.shutdown() }
        let alice = try TestClient(port: active.port, user: "alice", device: "laptop", configure: both)
        defer { alice.client.shutdown() }
        let session = try bob.connectAndSettle()
        try alice.connectAndSettle()
        #expect(try alice.request { alice.client.send(to: "bob", body: Array("m1".utf8), messageID: "m1", completion: $0) }.isSuccess)
        #expect(bob.recorder.wait { _ in bob.recorder.messages.contains { $0.messageID == "m1" } })

        let (bobBefore, aliceBefore) = (bob.recorder.all.count, alice.recorder.all.count)
        active.process.send(signal: SIGKILL)
        _ = active.process.waitForExit(timeoutSeconds: 10)
        guard case .connectionStateChanged(.connected(let moved)) = bob.recorder.first(within: 30, after: bobBefore, Self.isConnected(to: standbyPort)) else {
            Issue.record("bob did not reach the standby: \(bob.recorder.all.dropFirst(bobBefore))\n\(standby.log)"); return
        }
        #expect(moved.resumed && moved.sessionID == session.sessionID, "the session lives in Redis, so the new active node resumes it")
        #expect(alice.recorder.first(within: 30, after: aliceBefore, Self.isConnected(to: standbyPort)) != nil)
        #expect(try alice.request { alice.client.send(to: "bob", body: Array("m2".utf8), messageID: "m2", completion: $0) }.isSuccess)
        #expect(bob.recorder.wait { _ in bob.recorder.messages.contains { $0.messageID == "m2" } })
        #expect(bob.recorder.messages.map(\.messageID) == ["m1", "m2"], "each message once, in order")
    }
}
