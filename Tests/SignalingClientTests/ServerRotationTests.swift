import Testing
import SignalingProtocol
import SignalingSupport
#if canImport(Glibc)
import Glibc
#endif
@testable import SignalingClient

/// The walk over the servers of one connect attempt, as a pure state machine.
@Suite("Server rotation")
struct ServerRotationTests {
    static func address(_ last: UInt8, port: UInt16 = 7443) -> SocketAddress {
        SocketAddress(family: AF_INET, addressBytes: [127, 0, 0, last], port: port)!
    }
    static let start = Instant(nanoseconds: 1_000_000_000)
    static func at(_ milliseconds: Int64) -> Instant { start + .milliseconds(milliseconds) }
    static let goingAway = Close(code: .goingAway, retryAfterMs: 1000, retryJitterMs: 5000, message: "restarting")

    @Test("servers are tried from the preferred one on, wrapping around, and each name's addresses in the resolver's order")
    func order() {
        var rotation = ServerRotation(serverCount: 3, preferred: 1, deadline: Self.at(9000))
        #expect(rotation.order == [1, 2, 0])
        #expect(rotation.start() == .resolve(endpoint: 1))
        guard case .connect(1, let first, _) = rotation.resolved([Self.address(1), Self.address(2)], now: Self.start) else {
            Issue.record("no connect step"); return
        }
        #expect(first == Self.address(1))
        guard case .connect(1, let second, _) = rotation.failed(.refused(first), now: Self.at(1)) else {
            Issue.record("the second address was not tried"); return
        }
        #expect(second == Self.address(2))
        #expect(rotation.failed(.refused(second), now: Self.at(2)) == .resolve(endpoint: 2))
        #expect(rotation.failed(.resolutionFailed(host: "c", reason: "unknown"), now: Self.at(3)) == .resolve(endpoint: 0))
        guard case .connect(0, _, _) = rotation.resolved([Self.address(3)], now: Self.at(4)) else {
            Issue.record("the last server was not tried"); return
        }
        // Every server failed once: the walk ends rather than starting one again.
        guard case .failed = rotation.failed(.refused(Self.address(3)), now: Self.at(5)) else {
            Issue.record("the walk went on after every server failed"); return
        }
    }

    @Test("a preferred index beyond the list wraps; one server is the whole walk")
    func preferredWraps() {
        #expect(ServerRotation(serverCount: 2, preferred: 5, deadline: Self.start).order == [1, 0])
        var single = ServerRotation(serverCount: 1, preferred: 0, deadline: Self.at(1000))
        #expect(single.start() == .resolve(endpoint: 0))
        _ = single.resolved([Self.address(1)], now: Self.start)
        #expect(single.failed(.refused(Self.address(1)), now: Self.at(1)) == .failed(.refused(Self.address(1))))
    }

    @Test("each address gets a fair share of the time left, and the last one all of it")
    func fairShare() {
        // 3 servers, 9 s: the first address of the first server gets 3 s.
        var rotation = ServerRotation(serverCount: 3, preferred: 0, deadline: Self.at(9000))
        _ = rotation.start()
        #expect(rotation.resolved([Self.address(1)], now: Self.start) == .connect(endpoint: 0, address: Self.address(1), until: Self.at(3000)))
        // It timed out at its share: 6 s left for two servers, the second one has two addresses (3 candidates).
        #expect(rotation.failed(.timedOut, now: Self.at(3000)) == .resolve(endpoint: 1))
        #expect(rotation.resolved([Self.address(2), Self.address(3)], now: Self.at(3000))
                == .connect(endpoint: 1, address: Self.address(2), until: Self.at(5000)))
        // Refused at once: 6 s left over two candidates.
        #expect(rotation.failed(.refused(Self.address(2)), now: Self.at(3000))
                == .connect(endpoint: 1, address: Self.address(3), until: Self.at(6000)))
        #expect(rotation.failed(.refused(Self.address(3)), now: Self.at(3000)) == .resolve(endpoint: 2))
        // The last address of the last server gets everything that is left.
        #expect(rotation.resolved([Self.address(4)], now: Self.at(3500)) == .connect(endpoint: 2, address: Self.address(4), until: Self.at(9000)))
    }

    @Test("past the attempt's deadline the walk ends with what failed")
    func deadline() {
        var rotation = ServerRotation(serverCount: 3, preferred: 0, deadline: Self.at(1000))
        _ = rotation.start()
        _ = rotation.resolved([Self.address(1)], now: Self.start)
        #expect(rotation.failed(.timedOut, now: Self.at(1000)) == .failed(.timedOut))
    }

    @Test("a failure no other server can fix ends the walk at once: stop, credentials, cancellation")
    func terminalFailures() {
        let stop = Close(code: .unauthorized, retryAfterMs: 0, retryJitterMs: 0, message: "no")
        let expired = Close(code: .tokenExpired, retryAfterMs: 0, retryJitterMs: 0, message: "expired")
        for error: ConnectError in [.rejected(stop), .rejected(expired), .credentialsUnavailable(expired), .cancelled] {
            var rotation = ServerRotation(serverCount: 3, preferred: 0, deadline: Self.at(9000))
            _ = rotation.start()
            _ = rotation.resolved([Self.address(1)], now: Self.start)
            #expect(rotation.failed(error, now: Self.at(1)) == .failed(error), "\(error)")
            #expect(!ServerRotation.movesOn(after: error))
        }
    }

    @Test("a CLOSE from a node going away, overloaded or out of connections moves on, and a whole-list failure reports the last CLOSE so its advice is honoured")
    func closeMovesOn() {
        let overloaded = Close(code: .overloaded, retryAfterMs: 1000, retryJitterMs: 10_000, message: "busy")
        var rotation = ServerRotation(serverCount: 3, preferred: 0, deadline: Self.at(9000))
        _ = rotation.start()
        _ = rotation.resolved([Self.address(1)], now: Self.start)
        #expect(rotation.failed(.rejected(Self.goingAway), now: Self.at(1)) == .resolve(endpoint: 1))
        _ = rotation.resolved([Self.address(2)], now: Self.at(1))
        #expect(rotation.failed(.rejected(overloaded), now: Self.at(2)) == .resolve(endpoint: 2))
        _ = rotation.resolved([Self.address(3)], now: Self.at(2))
        #expect(rotation.failed(.refused(Self.address(3)), now: Self.at(3)) == .failed(.rejected(overloaded)))
    }

    @Test("a bad certificate on one node does not impose the long certificate wait when the others failed otherwise; on every node it does")
    func certificateFailures() {
        var mixed = ServerRotation(serverCount: 2, preferred: 0, deadline: Self.at(9000))
        _ = mixed.start()
        _ = mixed.resolved([Self.address(1)], now: Self.start)
        #expect(mixed.failed(.refused(Self.address(1)), now: Self.at(1)) == .resolve(endpoint: 1))
        _ = mixed.resolved([Self.address(2)], now: Self.at(1))
        #expect(mixed.failed(.certificateRejected("certificate has expired"), now: Self.at(2)) == .failed(.refused(Self.address(1))))

        var portal = ServerRotation(serverCount: 2, preferred: 0, deadline: Self.at(9000))
        _ = portal.start()
        _ = portal.resolved([Self.address(1)], now: Self.start)
        _ = portal.failed(.certificateRejected("unable to get local issuer certificate"), now: Self.at(1))
        _ = portal.resolved([Self.address(2)], now: Self.at(1))
        #expect(portal.failed(.pinMismatch(presented: "ab"), now: Self.at(2)) == .failed(.pinMismatch(presented: "ab")))
    }

    @Test("after a CLOSE that says the node cannot keep the device, the next server is preferred; otherwise the same one (sticky)")
    func preference() {
        #expect(ServerRotation.preferred(after: Self.goingAway, connected: 1, serverCount: 3) == 2)
        #expect(ServerRotation.preferred(after: Self.goingAway, connected: 2, serverCount: 3) == 0)
        #expect(ServerRotation.preferred(after: Close(code: .tooManyConnections, retryAfterMs: 0, retryJitterMs: 0, message: ""),
                                         connected: 0, serverCount: 2) == 1)
        #expect(ServerRotation.preferred(after: Close(code: .idleTimeout, retryAfterMs: 0, retryJitterMs: 0, message: ""),
                                         connected: 1, serverCount: 3) == 1)
        #expect(ServerRotation.preferred(after: nil, connected: 1, serverCount: 3) == 1)
        #expect(ServerRotation.preferred(after: Self.goingAway, connected: 0, serverCount: 1) == 0)
    }

    @Test("the TLS name of a server: its own, else the configuration's, else the host dialled")
    func tlsName() {
        let shared = ClientTLSConfiguration(caFile: nil, serverName: "signal.example.net")
        let perHost = ClientTLSConfiguration(caFile: nil)
        #expect(ServerEndpoint(host: "10.0.0.1", port: 7443).tlsName(under: shared) == "signal.example.net")
        #expect(ServerEndpoint(host: "node-a.example.net", port: 7443).tlsName(under: perHost) == "node-a.example.net")
        #expect(ServerEndpoint(host: "10.0.0.2", port: 7443, tlsServerName: "node-b.example.net").tlsName(under: shared) == "node-b.example.net")
    }

    @Test("the configuration: the single-server initialiser is a one-element list; an empty list or a bad entry is refused by name")
    func configuration() {
        let single = ClientConfiguration(host: "127.0.0.1", port: 7443, userID: "a", deviceID: "d")
        #expect(single.servers == [ServerEndpoint(host: "127.0.0.1", port: 7443)])
        #expect(single.host == "127.0.0.1" && single.port == 7443)
        var list = ClientConfiguration(servers: [ServerEndpoint(host: "a", port: 1), ServerEndpoint(host: "b", port: 0)], userID: "a", deviceID: "d")
        #expect(throws: ClientConfigurationError.invalid("servers[1]: port must not be 0")) { try list.validate() }
        list.servers = []
        #expect(throws: ClientConfigurationError.invalid("servers is empty")) { try list.validate() }
    }
}
