import Dispatch
import SignalingProtocol
@testable import SignalingServer
import SignalingStore
import SignalingStoreRedis
import SignalingSupport
import TestSupport
import Testing

/// A front and a home whose node links are real `RedisNodeLink`s on a real redis-server:
/// what the in-memory bus cannot show, a `listen(as:)` that takes effect only once Redis
/// has run its SUBSCRIBE.
@Suite("Front and home on a real Redis link", .serialized, .enabled(if: RedisServer.isAvailable, "redis-server is not installed"))
struct FrontOnRedisTests {
    @Test("a front that addresses a home before Redis has run the home's SUBSCRIBE holds its devices, and relays them once the home listens: none is closed")
    func frontWaitsUntilTheHomeListens() throws {
        let redis = try RedisServer(settings: [])
        let endpoint = try RedisEndpoint(url: redis.url())
        let homeLink = try RedisNodeLink(endpoint: endpoint, presenceTTL: .seconds(8), logger: .silent)
        let home = try TestServer(relay: homeLink)
        homeLink.start { [server = home.server] in server.receive($0) }
        defer { homeLink.stop() }

        let frontLink = try RedisNodeLink(endpoint: endpoint, presenceTTL: .seconds(8), logger: .silent)
        let relay = FrontRelay(link: frontLink)
        frontLink.start { relay.receive($0) }
        defer { frontLink.stop() }
        let configuration = TestServer.configuration()
        let front = try SignalingServer(configuration: configuration, logger: .silent, front: relay)
        try front.start()
        defer { front.shutdown() }

        // The lease thread saw the new holder, which has not subscribed to its name yet.
        let name = "lease-owner-1"
        relay.setHome(name)
        #expect(eventually { relay.unavailableReason?.contains("does not listen") == true }, "\(relay.unavailableReason ?? "ready")")
        let early = try TestClient(port: front.port)
        try early.send(.hello(Hello(userID: "alice", deviceID: "d1")))
        #expect(eventually { front.openConnectionsPerLoop.reduce(0, +) == 1 })

        homeLink.listen(as: name)
        // A device right after listen(as:) returns, before Redis has run the SUBSCRIBE.
        let late = try TestClient(port: front.port)
        try late.send(.hello(Hello(userID: "bob", deviceID: "d1")))
        // The lease thread's next polls ask the link whether the home listens.
        #expect(eventually {
            relay.setHome(name)
            return relay.unavailableReason == nil
        })
        for (who, device) in [("alice", early), ("bob", late)] {
            let frame = try device.read(timeout: .seconds(10))
            guard case .welcome? = frame else {
                Issue.record("\(who) got \(String(describing: frame)) instead of WELCOME")
                continue
            }
        }
        #expect(home.server.statistics.openConnections == 2, "both devices are relayed to the home")
        #expect(frontLink.statistics().undeliverable == 0, "nothing was sent to the home before it listened")
    }

    @Test("a takeover on a real Redis lease and link: a device that reaches a front while the new home still loads its store is held, then served by it once it listens")
    func frontHoldsDevicesWhileTheNewHomeLoads() throws {
        let redis = try RedisServer(settings: [])
        let endpoint = try RedisEndpoint(url: redis.url())
        var configuration = TestServer.configuration()
        configuration.drainTimeout = .seconds(1)
        configuration.storage.redisLeaseTTL = .seconds(2)
        func member(openStore: @escaping @Sendable (String) throws(StoreError) -> any EventStore) throws -> LeasedNode {
            let link = try RedisNodeLink(endpoint: endpoint, presenceTTL: .seconds(8), logger: .silent)
            return LeasedNode(
                configuration: configuration, lease: RedisLease(endpoint: endpoint, ttl: .seconds(2)), logger: .silent, link: link,
                openStore: openStore)
        }
        // The home takes the lease first; its store opens only when the test says (a long
        // snapshot load), so it cannot listen on the link yet.
        let storeOpens = DispatchSemaphore(value: 0)
        let home = try member { _ throws(StoreError) in
            storeOpens.wait()
            return ModelEventStore()
        }
        home.start()
        defer { home.stop() }
        let holder = RedisLease(endpoint: endpoint, ttl: .seconds(2))
        #expect(eventually { holder.holder() != nil }, "the home took the lease")

        let front = try member { _ throws(StoreError) in ModelEventStore() }
        front.start()
        defer { front.stop() }
        #expect(eventually { front.role == .front && front.frontServer?.isRunning == true })
        #expect(eventually { front.frontReadiness.noRoute?.contains("does not listen") == true }, "\(front.frontReadiness.reasons)")
        let device = try TestClient(port: try #require(front.frontServer?.port))
        try device.send(.hello(Hello(userID: "alice", deviceID: "d1")))
        #expect(try device.staysSilent(for: .milliseconds(300)), "held: neither answered nor closed")

        storeOpens.signal()
        guard case .welcome? = try device.read(timeout: .seconds(20)) else {
            Issue.record("the held device was not served by the new home")
            return
        }
        #expect(home.role == .active && front.frontReadiness.isReady)
        try device.send(.ping)
        #expect(try device.next() == .pong)
    }
}
