import SignalingProtocol
@testable import SignalingServer
import SignalingStore
import SignalingSupport
import TestSupport
import Testing

/// A cluster member (`LeasedNode` with a link): a front while another node holds the
/// lease, the home once it takes it, a front again after stepping down. The lease is a
/// `FakeLease` on a manual clock; the other node is a `TestHome` on a local bus.
@Suite("Cluster member: a front while another node holds the lease, the home while it holds it", .serialized)
struct ClusterMemberTests {
    static let ttl: Duration = .seconds(12)


    @Test("a front relays to the lease holder; taking the lease closes its front devices goingAway and starts the home; stepping down makes it a front again")
    func frontHomeFront() throws {
        let clock = ManualClock()
        let lease = FakeLease(ttl: Self.ttl, clock: clock, holder: "other-node")
        let bus = LocalNodeBus()
        let other = TestHome(bus: bus, name: "other-node")
        defer { other.stop() }
        let link = bus.makeLink(named: "member")
        var configuration = ServerConfiguration()
        configuration.host = "127.0.0.1"
        configuration.port = 0
        configuration.threadPlacement = .off  // as TestServer: many servers in one process
        configuration.tickInterval = .milliseconds(5)
        configuration.drainTimeout = .seconds(1)
        let node = LeasedNode(configuration: configuration, lease: lease, clock: clock, logger: .silent, link: link) { _ in
            ModelEventStore()
        }
        node.start()
        defer { node.stop() }

        #expect(eventually { node.role == .front && node.frontReadiness.isReady })
        #expect(node.listeningDescription.hasPrefix("front, listening on 127.0.0.1:"), "\(node.listeningDescription)")
        let frontPort = try #require(node.frontServer?.port)
        let device = try TestClient(port: frontPort)
        let open = try other.waitForOpen()
        other.send([.data(connection: open.connection, bytes: FrameEncoder.encode(.pong))], to: link.nodeID)
        #expect(try device.read(timeout: .seconds(10)) == .pong)

        lease.setHolder(nil)  // the other node's lease expired
        #expect(eventually { clock.advance(by: .milliseconds(100)); return node.role == .active })
        #expect(closeCode(try readToEnd(device).first) == .goingAway)
        #expect(node.frontServer == nil)
        let port = try #require(node.listeningDescription.split(separator: ":").last.flatMap { UInt16($0) })
        let direct = try TestClient(port: port)
        try direct.hello(user: "alice")

        lease.setHolder("other-node")  // taken away: the next refresh finds out
        #expect(eventually { clock.advance(by: .milliseconds(500)); return node.role == .front && node.frontServer != nil })
        #expect(closeCode(try readToEnd(direct).first) == .goingAway)
        #expect(eventually { node.frontReadiness.isReady })
        let again = try TestClient(port: try #require(node.frontServer?.port))
        let reopened = try other.waitForOpen(1)
        other.send([.data(connection: reopened.connection, bytes: FrameEncoder.encode(.pong))], to: link.nodeID)
        #expect(try again.read(timeout: .seconds(10)) == .pong)
    }

    @Test("a front without a home (the lease free, another node's being taken), or whose home does not listen yet, is not ready; a standby is never a front")
    func readiness() throws {
        let bus = LocalNodeBus()
        let relay = FrontRelay(link: bus.makeLink())
        #expect(relay.unavailableReason != nil, "the link is not up yet")
        relay.receive(.up)
        #expect(relay.unavailableReason?.contains("no routing node") == true)
        relay.setHome("someone")
        #expect(relay.unavailableReason?.contains("someone does not listen") == true, "the home must be heard listening first")
        relay.receive(.listening(node: "other"))  // an answer about another node changes nothing
        #expect(relay.unavailableReason != nil)
        relay.receive(.listening(node: "someone"))  // the link's answer
        #expect(relay.unavailableReason == nil)
        relay.receive(.down(reason: "test"))
        #expect(relay.unavailableReason?.contains("link") == true)

        let clock = ManualClock()
        let lease = FakeLease(ttl: Self.ttl, clock: clock, holder: "other-node")
        var configuration = ServerConfiguration()
        configuration.host = "127.0.0.1"
        configuration.port = 0
        configuration.threadPlacement = .off  // as TestServer: many servers in one process
        let standby = LeasedNode(configuration: configuration, lease: lease, clock: clock, logger: .silent) { _ in ModelEventStore() }
        standby.start()
        defer { standby.stop() }
        #expect(eventually { lease.attempts >= 1 })
        #expect(standby.role == .standby && standby.frontServer == nil)
    }

    @Test("a front's admin API: /readyz 200 while its link is up and a home exists, 503 with a front: reason when the link is down; role front in /metrics")
    func frontAdmin() throws {
        let clock = ManualClock()
        let lease = FakeLease(ttl: Self.ttl, clock: clock, holder: "other-node")
        let bus = LocalNodeBus()
        let other = TestHome(bus: bus, name: "other-node")
        defer { other.stop() }
        let link = bus.makeLink(named: "member")
        var configuration = ServerConfiguration()
        configuration.host = "127.0.0.1"
        configuration.port = 0
        configuration.threadPlacement = .off  // as TestServer: many servers in one process
        configuration.admin = AdminConfiguration(host: "127.0.0.1", port: 0, token: nil)
        let log = LogFile()
        let node = LeasedNode(configuration: configuration, lease: lease, clock: clock, logger: log.logger, link: link) { _ in
            ModelEventStore()
        }
        node.start()
        defer { node.stop() }
        try log.waitFor("admin_listening")
        let admin = try #require(log.lines("admin_listening").first.flatMap { ServiceDeploymentTests.adminPort(in: $0) })
        #expect(log.lines("admin_listening").first?.contains("role=front") == true)
        #expect(eventually { (try? HTTPRequest.send("GET", port: admin, "/readyz"))?.status == 200 })
        let device = try TestClient(port: try #require(node.frontServer?.port))
        #expect(eventually { node.frontServer?.openConnectionsPerLoop.reduce(0, +) == 1 })
        let metrics = try HTTPRequest.send("GET", port: admin, "/metrics")
        #expect(metrics.text.contains("voipserver_role{role=\"front\"} 1") && metrics.text.contains("voipserver_ready 1"), "\(metrics.text)")
        #expect(metrics.text.contains("voipserver_front_connections 1"), "\(metrics.text)")
        _ = device

        bus.cut(link)
        #expect(eventually { (try? HTTPRequest.send("GET", port: admin, "/readyz"))?.status == 503 })
        #expect(try HTTPRequest.send("GET", port: admin, "/readyz").text.contains("front: the link to the other nodes is down"))
        #expect(try HTTPRequest.send("GET", port: admin, "/v1/stats").status == 503)
    }

    @Test("--cluster: a Redis URL (or a comma list of them) that is also the store; with a different --store or another scheme it is a usage error; --cluster-link moves only the link, and needs --cluster")
    func clusterOption() throws {
        func parse(_ arguments: [String]) throws -> ServerConfiguration { try ServerOptions.configuration(from: arguments).0 }
        #expect(!ServerConfiguration().storage.cluster)
        let member = try parse(["--cluster", "redis://127.0.0.1:6379/2"])
        #expect(member.storage.cluster && member.storage.mode == .redis && member.storage.redisURL == "redis://127.0.0.1:6379/2")
        #expect(try parse(["--cluster", "redis://r:6379", "--store", "redis://r:6379", "--redis-lease-ttl", "3"]).storage.cluster)
        #expect(!(try parse(["--store", "redis://r:6379"])).storage.cluster)
        func failure(_ arguments: [String]) -> String? {
            do {
                _ = try ServerOptions.configuration(from: arguments)
                return nil
            } catch {
                return error.message
            }
        }
        #expect(failure(["--cluster", "redis://a:6379", "--store", "redis://b:6379"])?.contains("different stores") == true)
        #expect(failure(["--cluster", "redis://a:6379", "--store", "sqlite"])?.contains("different stores") == true)
        let sharded = try parse(["--cluster", "redis://a:6379,redis://b:6379"])
        #expect(sharded.storage.cluster && sharded.storage.redisURL == "redis://a:6379,redis://b:6379")
        #expect(try parse(["--store", "redis://a:6379, redis://b:6379/2"]).storage.redisURL == "redis://a:6379, redis://b:6379/2")
        #expect(failure(["--cluster", "redis://a:6379,b:6379"])?.contains("several separated by commas") == true)
        #expect(failure(["--store", "redis://a:6379,sqlite"]) != nil)
        #expect(failure(["--cluster", "a:6379"]) != nil)
        #expect(member.storage.clusterLinkURL == nil, "the link rides on the store's Redis unless told")
        let separateLink = try parse(["--cluster", "redis://r:6379", "--cluster-link", "redis://l:6380/3"])
        #expect(separateLink.storage.clusterLinkURL == "redis://l:6380/3" && separateLink.storage.redisURL == "redis://r:6379")
        #expect(failure(["--cluster-link", "redis://l:6380"])?.contains("needs --cluster") == true)
        #expect(failure(["--cluster", "redis://r:6379", "--cluster-link", "l:6380"]) != nil)

        let path = "/tmp/voipserver-cluster-\(UInt32.random(in: 0...UInt32.max)).conf"
        #expect(writeFile(path, "cluster = redis://10.0.0.5:6379/1\n"))
        defer { removeFile(path) }
        let fromFile = try parse(["--config", path])
        #expect(fromFile.storage.cluster && fromFile.storage.redisURL == "redis://10.0.0.5:6379/1")
        #expect(ServerOptions.parser.helpText.contains("--cluster"))
    }
}
