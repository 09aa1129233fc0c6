import SignalingProtocol
import SignalingSupport
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// Issue 18 end to end: a real `redis-server` and three real `voipserver` nodes on
/// loopback (`ClusterProcesses`). With `--cluster` every node accepts devices and the
/// lease holder (node 0 at the start, the home) routes for all of them, so what
/// PROTOCOL.md promises must hold when the devices of one conversation sit on different
/// nodes, and across kill -9 of a node, a Redis restart and a partition.
///
/// Tests that take a topology also run as `.activeStandby` (`--store redis://...`: one
/// node serves, the others are standbys): the same scenario with every device on the one
/// serving node, which passes before the cluster exists and checks the scenario itself.
/// The `.cluster` cases fail (never skip) with "needs --cluster" until `voipserver` has the
/// option.
@Suite(
    "Cluster end to end: three voipserver nodes on one Redis, devices on different nodes", .serialized,
    .enabled(if: RedisServer.isAvailable, "redis-server is not installed"))
struct ClusterEndToEndTests {
    static let bothTopologies: [ClusterProcesses.Topology] = [.cluster, .activeStandby]

    let offer = Array("v=0 offer".utf8)
    let answer = Array("v=0 answer".utf8)

    /// The node ports a device tries, from node `first` on (wrapping around): with
    /// `.cluster` it lands on node `first`; with `.activeStandby` the standbys refuse the
    /// TCP connect and it lands on the active node.
    func ports(_ cluster: ClusterProcesses, from first: Int) -> [UInt16] {
        let count = cluster.nodes.count
        return (0..<count).map { cluster.devicePort((first + $0) % count) }
    }

    /// The port where a device meant for node `index` connects: that node with `.cluster`,
    /// the active node with `.activeStandby`.
    func entryPort(_ cluster: ClusterProcesses, _ index: Int) throws -> UInt16 {
        if cluster.topology.everyNodeAcceptsDevices { return cluster.devicePort(index) }
        return cluster.devicePort(try #require(cluster.home, "no active node\n\(cluster.describe())"))
    }

    /// Connects `device` and checks it landed on node `index` (with `.cluster`).
    func connect(_ device: ResumingDevice, on index: Int, in cluster: ClusterProcesses) throws {
        try device.connect()
        #expect(device.connectedPort == (try entryPort(cluster, index)), "\(device.user)/\(device.device) is not on node \(index)")
    }

    /// Whether the device has read the MESSAGE_DELIVERED receipt of message `id`.
    func hasReceipt(for id: String) -> (ResumingDevice) -> Bool {
        { device in
            device.events.contains { entry in
                if case .messageDelivered(id, _, _, _) = entry.event { return true }
                return false
            }
        }
    }

    // MARK: Messages, calls, takeover across nodes

    @Test("a message from a device on node 1 to a device on node 2 arrives, and its receipt comes back; and the other way",
          arguments: bothTopologies)
    func messagesAcrossNodes(topology: ClusterProcesses.Topology) throws {
        let cluster = try ClusterProcesses(topology: topology)
        let alice = ResumingDevice(user: "alice", ports: ports(cluster, from: 1))
        let bob = ResumingDevice(user: "bob", ports: ports(cluster, from: 2))
        try connect(alice, on: 1, in: cluster)
        try connect(bob, on: 2, in: cluster)
        if topology == .cluster {
            // Both sockets are on fronts: the home serves them as relayed connections.
            let metrics = try cluster.admin(0, "/metrics").text
            #expect(metrics.contains("voipserver_relayed_connections{transport=\"plain\"} 2\n"), "the home does not serve 2 relayed connections")
        }

        try alice.send("a1", to: "bob")
        try bob.receiveMessages(["a1"])
        try alice.receive(until: hasReceipt(for: "a1"))
        try bob.send("b1", to: "alice")
        try alice.receiveMessages(["b1"])
        try bob.receive(until: hasReceipt(for: "b1"))

        #expect(alice.deliveryProblems(expected: ["b1"]) == [])
        #expect(bob.deliveryProblems(expected: ["a1"]) == [])
        #expect(alice.connections == 1 && bob.connections == 1, "nobody had to reconnect")
    }

    @Test("/metrics on each node: a front counts the devices it relays, the home the devices relayed to it, each by transport (plain or TLS), and both count a device down when it leaves")
    func relayedConnectionsByTransport() throws {
        let certificates = try TestCertificates()
        let cluster = try ClusterProcesses(topology: .cluster, tls: certificates)
        /// The value of `metric{labels}` on node `index` (nil: no such sample).
        func sample(_ index: Int, _ metric: String, _ labels: String) throws -> Int? {
            let prefix = "\(metric){\(labels)} "
            let text = try cluster.admin(index, "/metrics").text
            return text.split(separator: "\n").first { $0.hasPrefix(prefix) }.flatMap { Int($0.dropFirst(prefix.count)) }
        }
        func gauge(_ index: Int, _ metric: String, _ transport: String) throws -> Int? {
            try sample(index, metric, "transport=\"\(transport)\"")
        }
        let home = "voipserver_relayed_connections", front = "voipserver_front_relayed_connections"

        let plainOnOne = try TestClient(port: cluster.devicePort(1))
        try plainOnOne.hello(user: "bob")
        let plainOnTwo = try TestClient(port: cluster.devicePort(2))
        try plainOnTwo.hello(user: "carol")
        let direct = try TestClient(port: cluster.devicePort(0))
        try direct.hello(user: "dave")  // the home's own socket: not relayed
        do {
            let secure = try TestClient(port: try #require(cluster.nodes[1].tlsPort), tls: TestTLS(caFile: certificates.caFile))
            try secure.hello(user: "alice")
            #expect(try gauge(0, home, "plain") == 2 && gauge(0, home, "tls") == 1, "the home: bob and carol plain, alice over TLS")
            #expect(try gauge(1, front, "plain") == 1 && gauge(1, front, "tls") == 1, "node 1 relays bob's plain and alice's TLS device")
            #expect(try gauge(2, front, "plain") == 1 && gauge(2, front, "tls") == 0, "node 2 relays carol's plain device")
            #expect(try sample(0, "voipserver_connections", "state=\"established\",transport=\"tls\"") == 0,
                    "the home holds no TLS socket: the TLS is the front's")
            // The front's listeners, as the home's: its TLS handshake and its certificate.
            #expect(try sample(1, "voipserver_tls_handshakes_total", "result=\"full\"") == 1)
            #expect(try gauge(1, "voipserver_connections_accepted_total", "tls") == 1)
            #expect(try cluster.admin(1, "/metrics").text.contains("voipserver_tls_certificate_expiry_timestamp_seconds "))
        }  // alice's socket closes
        #expect(eventually { (try? gauge(0, home, "tls")) == 0 && (try? gauge(1, front, "tls")) == 0 }, "alice left: counted down on both")
        #expect(try gauge(0, home, "plain") == 2 && gauge(1, front, "plain") == 1)
        _ = (plainOnOne, plainOnTwo, direct)
    }

    @Test("with --cluster-link the relay rides on a Redis of its own: messages cross nodes through it, and the store's Redis holds no presence key")
    func linkOnItsOwnRedis() throws {
        // The link's Redis needs no persistence: pub/sub and presence keys are not data.
        let linkRedis = try RedisServer(settings: ["--appendonly", "no", "--save", ""])
        let cluster = try ClusterProcesses(topology: .cluster, extra: ["--cluster-link", linkRedis.url("/0")])
        let alice = ResumingDevice(user: "alice", ports: ports(cluster, from: 1))
        let bob = ResumingDevice(user: "bob", ports: ports(cluster, from: 2))
        try connect(alice, on: 1, in: cluster)
        try connect(bob, on: 2, in: cluster)
        try alice.send("a1", to: "bob")
        try bob.receiveMessages(["a1"])
        try alice.receive(until: hasReceipt(for: "a1"))
        #expect(bob.deliveryProblems(expected: ["a1"]) == [])

        func presenceKeys(onPort port: UInt16) throws -> [String] {
            let run = try ExecutableRun.runProgram(
                "/usr/bin/redis-cli", ["-p", String(port), "--scan", "--pattern", "voip:node:*"], timeoutSeconds: 10)
            return run.stdout.split(separator: "\n").map(String.init)
        }
        #expect(try presenceKeys(onPort: linkRedis.port).count == 3, "each node's presence is on the link's Redis")
        #expect(try presenceKeys(onPort: cluster.redis.port) == [], "and none on the store's")
    }

    /// Alice on node 0, bob's phone on node 1, bob's laptop on node 2; alice invites bob
    /// and both of bob's devices ring.
    func ringBobOnThreeNodes(_ cluster: ClusterProcesses, callID: String, callerNode: Int = 0, phoneNode: Int = 1, laptopNode: Int = 2)
        throws -> (alice: TestClient, phone: TestClient, laptop: TestClient)
    {
        let alice = try TestClient(port: cluster.devicePort(callerNode))
        try alice.hello(user: "alice")
        let phone = try TestClient(port: cluster.devicePort(phoneNode))
        try phone.hello(user: "bob", device: "phone")
        let laptop = try TestClient(port: cluster.devicePort(laptopNode))
        try laptop.hello(user: "bob", device: "laptop")
        #expect(try alice.request(1, .callInvite(callID: callID, callee: "bob", offer: offer)).isOK)
        for (name, device) in [("phone", phone), ("laptop", laptop)] {
            let (seq, event) = try device.nextEvent()
            guard case .callIncoming(callID, "alice", "d1", offer, _) = event else {
                throw TestClient.Failure("bob's \(name) did not ring: \(event)")
            }
            try device.ack(seq)
        }
        return (alice, phone, laptop)
    }

    @Test("a call whose caller and the callee's two devices sit on three nodes: both ring, the first accept wins, the other device hears answeredElsewhere")
    func callAcrossThreeNodes() throws {
        let cluster = try ClusterProcesses(topology: .cluster)
        let (alice, phone, laptop) = try ringBobOnThreeNodes(cluster, callID: "c1")

        #expect(try laptop.request(1, .callAccept(callID: "c1", answer: answer)).isOK)
        #expect(try alice.nextEvent().event == .callAccepted(callID: "c1", device: "laptop", answer: answer))
        guard case .callEnded("c1", .answeredElsewhere, "alice", _) = try phone.nextEvent().event else {
            Issue.record("the phone on node 1 was not told that the laptop on node 2 answered")
            return
        }
        #expect(try phone.request(1, .callAccept(callID: "c1", answer: answer)).errorCode == .illegalCallTransition,
                "the late accept changes nothing")
        #expect(try alice.request(2, .callHangup(callID: "c1")).isOK)
        guard case .callEnded("c1", .hungUp, "alice", _) = try laptop.nextEvent().event else {
            Issue.record("the laptop on node 2 did not hear the hang-up from node 0")
            return
        }
    }

    @Test("nobody answers a call across three nodes: after --ring-timeout the caller and both callee devices hear noAnswer")
    func ringTimeoutAcrossNodes() throws {
        let cluster = try ClusterProcesses(topology: .cluster, extra: ["--ring-timeout", "2"])
        let (alice, phone, laptop) = try ringBobOnThreeNodes(cluster, callID: "c2")
        guard case .callEnded("c2", .noAnswer, "bob", _) = try alice.nextEvent(timeout: .seconds(8)).event else {
            Issue.record("the caller on node 0 was not told of the ring timeout")
            return
        }
        for (name, device) in [("phone", phone), ("laptop", laptop)] {
            guard case .callEnded("c2", .noAnswer, "alice", _) = try device.nextEvent(timeout: .seconds(8)).event else {
                Issue.record("bob's \(name) was not told of the missed call")
                return
            }
        }
    }

    @Test("the caller's device vanishes mid-ring on its node: after --call-grace the callee's devices on the other nodes hear peerDisconnected")
    func callerVanishesAcrossNodes() throws {
        let cluster = try ClusterProcesses(topology: .cluster, extra: ["--call-grace", "1"])
        // The caller on a front (node 1): its node relays the end of its connection.
        let (alice, phone, laptop) = try ringBobOnThreeNodes(cluster, callID: "c3", callerNode: 1, phoneNode: 0, laptopNode: 2)
        shutdown(alice.fd, Int32(SHUT_RDWR))  // the caller's connection ends
        for (name, device) in [("phone", phone), ("laptop", laptop)] {
            guard case .callEnded("c3", .peerDisconnected, "alice", _) = try device.nextEvent(timeout: .seconds(8)).event else {
                Issue.record("bob's \(name) was not told that the caller vanished")
                return
            }
        }
    }

    @Test("takeover across nodes: the same device connecting to node 2 while connected to node 1 replaces the old connection (CLOSE replaced)",
          arguments: bothTopologies)
    func takeoverAcrossNodes(topology: ClusterProcesses.Topology) throws {
        let cluster = try ClusterProcesses(topology: topology)
        let old = try TestClient(port: try entryPort(cluster, 1))
        let session = try old.hello(user: "bob", device: "phone").sessionID
        let new = try TestClient(port: try entryPort(cluster, 2))
        let welcome = try new.hello(user: "bob", device: "phone", resume: ResumePoint(sessionID: session, lastReceivedSeq: 0))
        #expect(welcome.resumed)
        #expect(try old.expectClose().code == .replaced, "the connection on node 1 is told it was replaced")

        let alice = try TestClient(port: try entryPort(cluster, 0))
        try alice.hello(user: "alice")
        #expect(try alice.request(1, .identifiedMessage("after-takeover", to: "bob")).isOK)
        guard case .message(let message) = try new.nextEvent().event else {
            Issue.record("the new connection on node 2 did not get the message")
            return
        }
        #expect(message.messageID == "after-takeover")
    }

    // MARK: Failures

    /// Alice sends `ids` to bob in order (each until accepted).
    func send(_ ids: [String], from alice: ResumingDevice, to recipient: String = "bob") throws {
        for id in ids { try alice.send(id, to: recipient) }
    }

    func messageIDs(_ range: ClosedRange<Int>) -> [String] { range.map { "m\($0)" } }

    /// Alice on node 1 sends bob on node 2 m1...m8; bob has read m1...m5, and m6...m8 are
    /// acknowledged to alice but may not have been read: the traffic a node is killed in.
    func trafficFromNode1ToNode2(_ cluster: ClusterProcesses) throws -> (alice: ResumingDevice, bob: ResumingDevice) {
        let alice = ResumingDevice(user: "alice", ports: ports(cluster, from: 1))
        let bob = ResumingDevice(user: "bob", ports: ports(cluster, from: 2))
        try connect(alice, on: 1, in: cluster)
        try connect(bob, on: 2, in: cluster)
        try send(messageIDs(1...5), from: alice)
        try bob.receiveMessages(messageIDs(1...5))
        try send(messageIDs(6...8), from: alice)
        return (alice, bob)
    }

    @Test("kill -9 of a front mid-traffic: its devices resume on another node with everything acknowledged, the same numbers, once")
    func frontKilledMidTraffic() throws {
        let cluster = try ClusterProcesses(topology: .cluster)
        let (alice, bob) = try trafficFromNode1ToNode2(cluster)

        cluster.killNode(2)  // bob's front
        try send(messageIDs(9...12), from: alice)
        try bob.receiveMessages(messageIDs(1...12))

        #expect(bob.deliveryProblems(expected: messageIDs(1...12)) == [])
        #expect(bob.consecutive(messageIDs(1...12)), "one home numbered them all: \(bob.seqs(of: messageIDs(1...12)))")
        #expect(bob.connections == 2, "bob reconnected once")
        #expect(bob.connectedPort != cluster.devicePort(2))
        #expect(alice.connections == 1, "alice's node and the home lived on: she never reconnected")
        #expect(cluster.home == 0, "killing a front does not move the home\n\(cluster.describe())")
    }

    @Test("kill -9 of the home mid-traffic: another node takes over within about the lease TTL and the devices resume there, nothing acknowledged lost, once",
          arguments: [(ClusterProcesses.Topology.cluster, 1), (.activeStandby, 1), (.cluster, 3)])
    func homeKilledMidTraffic(topology: ClusterProcesses.Topology, redisInstances: Int) throws {
        // With three Redis instances the new home fences every one before it reads them.
        let cluster = try ClusterProcesses(topology: topology, leaseTTL: 1, redisInstances: redisInstances)
        let (alice, bob) = try trafficFromNode1ToNode2(cluster)

        let clock = SystemClock()
        cluster.killNode(0)
        let killed = clock.now()
        let newHome = try cluster.waitUntilServing(timeoutSeconds: 20)
        let takeover = clock.now() - killed
        #expect(newHome != 0)
        // The 1 s TTL, a poll (100 ms), the start; generous for a loaded 2-core machine.
        #expect(takeover < .seconds(6), "node \(newHome) took over \(takeover) after the kill")
        if redisInstances > 1 {
            // alice's keys are on the first instance, bob's on the third (the user hash).
            #expect(cluster.nodes[newHome].log.contains("event=store_fenced"), "the new home fenced the other instances")
        }

        try send(messageIDs(9...12), from: alice)
        try bob.receiveMessages(messageIDs(1...12))
        #expect(bob.deliveryProblems(expected: messageIDs(1...12)) == [])
        // m6...m8 were numbered by the dead home; read after the takeover they keep their
        // numbers. The new home continues past the old one's reservation (a jump is legal).
        #expect(bob.consecutive(messageIDs(1...8)), "the same numbers: \(bob.seqs(of: messageIDs(1...8)))")
        #expect(bob.consecutive(messageIDs(9...12)), "\(bob.seqs(of: messageIDs(9...12)))")
        #expect(bob.connections >= 2 && alice.connections >= 2, "both devices lost the home and resumed")

        // The killed node, started again on its ports, joins as a member; the home stays.
        try cluster.restartNode(0)
        #expect(try cluster.waitUntilServing() == newHome, "the restarted node 0 must not take the lease back")
        #expect(cluster.nodes[0].readyStatus == topology.memberReadyStatus)
    }

    @Test("Redis killed and restarted mid-traffic: sends are refused with storeUnavailable while it is away, and nothing acknowledged is lost",
          arguments: bothTopologies)
    func redisRestartedMidTraffic(topology: ClusterProcesses.Topology) throws {
        // A TTL long enough that the home keeps its lease through the restart (it steps
        // down at 3/4 of it without a confirmed refresh).
        let cluster = try ClusterProcesses(topology: topology, leaseTTL: 6, extra: ["--store-timeout", "1"])
        let alice = ResumingDevice(user: "alice", ports: ports(cluster, from: 0))  // on the home
        let bob = ResumingDevice(user: "bob", ports: ports(cluster, from: 1))
        try connect(alice, on: 0, in: cluster)
        try connect(bob, on: 1, in: cluster)
        try send(messageIDs(1...3), from: alice)
        try bob.receiveMessages(messageIDs(1...3))

        cluster.killRedis()
        // To a third user: a refused message may still have gone out to a connected
        // recipient before its commit failed (STORAGE.md, immediate delivery), and bob's
        // count must stay exact.
        let client = try #require(alice.client)
        let refused = try client.request(900, .identifiedMessage("while-away", to: "carol"))
        #expect(refused.errorCode == .storeUnavailable, "a send while Redis is away is refused: \(refused)")
        try cluster.restartRedis()
        try alice.send("store-back", to: "carol")  // retried until the store accepts again

        try send(messageIDs(4...6), from: alice)
        try bob.receiveMessages(messageIDs(1...6))
        #expect(bob.deliveryProblems(expected: messageIDs(1...6)) == [], "nothing acknowledged lost, nothing twice")
        #expect(bob.consecutive(messageIDs(1...6)), "one term of one home numbered them: \(bob.seqs(of: messageIDs(1...6)))")
        #expect(alice.connections == 1, "the device on the home stayed connected")
        #expect(try cluster.waitUntilServing() == 0, "the home kept its lease (the AOF kept it)")
    }

    @Test("a device cut off from its node by a partition resumes on another node: the stranded connection is replaced, and it gets everything acknowledged, once",
          arguments: bothTopologies)
    func resumeAfterPartition(topology: ClusterProcesses.Topology) throws {
        let cluster = try ClusterProcesses(topology: topology)
        let alice = ResumingDevice(user: "alice", ports: ports(cluster, from: 0))
        try connect(alice, on: 0, in: cluster)
        // Bob reaches node 1 through a relay the test can stop.
        let relay = try TCPRelay(upstreamPort: try entryPort(cluster, 1))
        defer { relay.stop() }
        let bob = ResumingDevice(user: "bob", ports: [relay.port])
        try bob.connect()
        try alice.send("m1", to: "bob")
        try bob.receiveMessages(["m1"])

        // The partition: nothing passes either way, and neither end sees the connection end.
        relay.setDropping(.toServer, true)
        relay.setDropping(.toClient, true)
        let stranded = try #require(bob.client)
        try send(["m2", "m3"], from: alice)  // acknowledged: the home wrote them to bob's connection, into the void

        bob.dropConnection()
        bob.ports = [try entryPort(cluster, 2)]
        try bob.connect()
        try bob.receiveMessages(["m1", "m2", "m3"])
        #expect(bob.deliveryProblems(expected: ["m1", "m2", "m3"]) == [])
        #expect(bob.consecutive(["m1", "m2", "m3"]), "m2 and m3 keep the numbers they were written under: \(bob.seqs(of: ["m1", "m2", "m3"]))")
        withExtendedLifetime(stranded) {}  // open until here: the node never saw it end
    }
}
