import Foundation
import SignalingSupport
#if canImport(Glibc)
import Glibc
#endif

/// Several real `voipserver` nodes on one real `redis-server` (docs/CLUSTER.md), for the
/// end-to-end tests of issue 18: every node is a subprocess with its own device port and
/// admin port, both fixed when the cluster is made, so that a node killed and started
/// again (or a front that becomes the home) is found where the devices and the test expect
/// it. Redis can be killed and started again on its port with its AOF.
///
/// Node 0 is started first and waited for until it holds the lease, then the others: at
/// the start node 0 is the home (the routing node, `lease_acquired` in its log); after a
/// failure `waitUntilServing` says which node is.
///
/// Everything is killed (SIGKILL) when released, so a failing test leaves nothing behind.
public final class ClusterProcesses {
    /// How the nodes are started; `arguments(...)` is the one place their command line is made.
    public enum Topology: String, Sendable, CustomStringConvertible {
        /// `--cluster redis://...` (issue 18): every node accepts devices; the lease holder
        /// routes (the home), the others relay their devices to it (fronts).
        case cluster
        /// `--store redis://...` (what exists before issue 18): the lease holder is the
        /// only node that listens; the others are standbys with no device listener.
        case activeStandby

        /// The `/readyz` status of a serving node that does not hold the lease: a front
        /// answers 200 while it has a link and a home, a standby 503.
        public var memberReadyStatus: Int { self == .cluster ? 200 : 503 }

        /// Whether a node that does not hold the lease accepts devices.
        public var everyNodeAcceptsDevices: Bool { self == .cluster }

        public var description: String { rawValue }
    }

    /// One node: its ports (the same across restarts) and its current process.
    public final class Node {
        public let index: Int
        public let devicePort: UInt16
        public let adminPort: UInt16
        /// The TLS device listener's port, when the cluster was made with certificates.
        public let tlsPort: UInt16?
        /// The running process; nil once killed (until `restartNode`).
        public fileprivate(set) var process: ServerProcess?

        init(index: Int, devicePort: UInt16, adminPort: UInt16, tlsPort: UInt16?) {
            self.index = index
            self.devicePort = devicePort
            self.adminPort = adminPort
            self.tlsPort = tlsPort
        }

        public var isRunning: Bool { process.map { $0.process.poll() == nil } ?? false }

        /// The log of the current process (empty when none runs).
        public var log: String { process?.log ?? "" }

        /// Whether the current process's log says it holds the lease now: its last
        /// `lease_acquired` is not followed by a `stepped_down`.
        public var logSaysHoldsLease: Bool {
            let text = log
            guard let acquired = text.range(of: "event=lease_acquired ", options: .backwards) else { return false }
            guard let steppedDown = text.range(of: "event=stepped_down ", options: .backwards) else { return true }
            return acquired.lowerBound > steppedDown.lowerBound
        }

        /// `/readyz`'s status, nil when the admin API does not answer.
        public var readyStatus: Int? {
            try? HTTPRequest.send("GET", port: adminPort, "/readyz", timeout: .seconds(2)).status
        }
    }

    /// The store's Redis instances (`--store`/`--cluster redis://A,redis://B,...`); the first
    /// holds the lease and the node link.
    public let redisInstances: [RedisServer]
    public var redis: RedisServer { redisInstances[0] }
    public let topology: Topology
    /// `--redis-lease-ttl`, in seconds.
    public let leaseTTL: Double
    /// More `voipserver` options for every node (`--ring-timeout 2`, `--store-timeout 1`...).
    public let extraArguments: [String]
    /// Every node's TLS listener serves this server certificate (nil: no TLS listener).
    public let certificates: TestCertificates?
    public let nodes: [Node]

    /// The text a cluster test fails with when `voipserver` does not know `--cluster`.
    public static let needsClusterOption =
        "needs --cluster: this voipserver does not know the option (issue 18's nodes that all serve devices are not built in)"

    /// Throws (a failure, not a skip) unless `voipserver --help` lists `--cluster`.
    public static func requireClusterOption() throws {
        let help = try ExecutableRun.run("voipserver", ["--help"], timeoutSeconds: 30)
        guard (help.stdout + help.stderr).contains("--cluster") else { throw TestFailure(needsClusterOption) }
    }

    /// A node's command line: the one place it is made.
    public static func arguments(
        topology: Topology, redisURL: String, leaseTTL: Double, devicePort: UInt16, adminPort: UInt16,
        tls: (port: UInt16, certificates: TestCertificates)? = nil, extra: [String]
    ) -> [String] {
        let store = topology == .cluster ? ["--cluster", redisURL] : ["--store", redisURL]
        let tlsListener = tls.map { tls in
            ["--tls-listen", "127.0.0.1:\(tls.port)", "--tls-cert", tls.certificates.serverChainFile, "--tls-key", tls.certificates.serverKeyFile]
        } ?? []
        return store + tlsListener + [
            "--redis-lease-ttl", String(leaseTTL),
            "--listen", "127.0.0.1:\(devicePort)",
            "--admin-listen", "127.0.0.1:\(adminPort)",
            // A node that steps down or is drained tells its devices to come back at once.
            "--drain-retry-after", "0", "--drain-jitter", "0", "--drain-timeout", "1",
            "--log-level", "info", "--log-format", "kv",
        ] + extra
    }

    /// Starts Redis (durable: AOF, fsync always) and `count` nodes, and waits until node 0
    /// holds the lease and every node serves (`waitUntilServing`).
    /// `redisInstances`: how many Redis the store spreads its users over (one by default).
    /// `tls`: every node also listens for devices over TLS (`Node.tlsPort`) with this
    /// server certificate.
    public init(
        nodes count: Int = 3, topology: Topology = .cluster, leaseTTL: Double = 1, extra: [String] = [],
        redisInstances instanceCount: Int = 1, tls: TestCertificates? = nil, timeoutSeconds: Double = 30
    ) throws {
        if topology == .cluster { try Self.requireClusterOption() }
        redisInstances = try (0..<instanceCount).map { _ in try RedisServer() }
        self.topology = topology
        self.leaseTTL = leaseTTL
        extraArguments = extra
        certificates = tls
        var nodes: [Node] = []
        var taken = Set(redisInstances.map(\.port))
        func freshPort() throws -> UInt16 {
            while true {
                let port = try unusedLoopbackPort()
                if taken.insert(port).inserted { return port }
            }
        }
        for index in 0..<count {
            nodes.append(Node(
                index: index, devicePort: try freshPort(), adminPort: try freshPort(), tlsPort: tls == nil ? nil : try freshPort()))
        }
        self.nodes = nodes
        try start(nodes[0])
        try waitFor("node 0 to take the lease", timeoutSeconds: timeoutSeconds) { nodes[0].logSaysHoldsLease }
        for node in nodes.dropFirst() { try start(node) }
        let home = try waitUntilServing(timeoutSeconds: timeoutSeconds)
        guard home == 0 else { throw TestFailure("node \(home) holds the lease, expected node 0 (started first)\n\(describe())") }
    }

    deinit {
        for node in nodes { node.process = nil }
    }

    /// `/v1/...`, `/readyz`, `/metrics` of a node.
    public func admin(_ index: Int, _ path: String) throws -> HTTPReply {
        try HTTPRequest.send("GET", port: nodes[index].adminPort, path)
    }

    public func devicePort(_ index: Int) -> UInt16 { nodes[index].devicePort }

    /// The live nodes whose logs say they hold the lease (exactly one once serving).
    public var leaseHolders: [Int] { nodes.filter { $0.isRunning && $0.logSaysHoldsLease }.map(\.index) }

    /// The home: the one live node holding the lease, nil while there is not exactly one.
    public var home: Int? {
        let holders = leaseHolders
        return holders.count == 1 ? holders[0] : nil
    }

    /// Waits until exactly one live node holds the lease and answers `/readyz` 200, and
    /// every other live node answers `/readyz` with the topology's member status (200 for
    /// a front, 503 for a standby); returns the home's index.
    @discardableResult
    public func waitUntilServing(timeoutSeconds: Double = 30) throws -> Int {
        var found: Int?
        try waitFor("exactly one node to hold the lease and every node to be ready", timeoutSeconds: timeoutSeconds) {
            guard let home, nodes[home].readyStatus == 200 else { return false }
            for node in nodes where node.index != home && node.isRunning {
                guard node.readyStatus == topology.memberReadyStatus else { return false }
            }
            found = home
            return true
        }
        return found!
    }

    /// SIGKILL of a node, and waits for its exit: its connections drop, its lease (if it
    /// held it) expires after the TTL.
    public func killNode(_ index: Int) {
        guard let server = nodes[index].process else { return }
        server.process.send(signal: SIGKILL)
        _ = server.process.waitForExit(timeoutSeconds: 10)
    }

    /// Starts a killed node again on the same ports (a fresh data directory: with a Redis
    /// store nothing it needs is local).
    public func restartNode(_ index: Int) throws {
        killNode(index)
        nodes[index].process = nil
        try start(nodes[index])
    }

    /// SIGKILL of Redis: nothing after its last fsync survives (with `appendfsync always`,
    /// every acknowledged write did).
    public func killRedis() { redis.kill() }

    /// Starts Redis again on the same port and directory, with what its AOF holds.
    public func restartRedis() throws { try redis.start() }

    /// Every node's state and the tail of its log, for a failure message.
    public func describe() -> String {
        nodes.map { node in
            let tail = node.log.split(separator: "\n").suffix(8).joined(separator: "\n    ")
            return "node \(node.index) (device port \(node.devicePort), admin \(node.adminPort)): "
                + (node.isRunning ? "running" : "not running")
                + ", holds the lease: \(node.logSaysHoldsLease), /readyz \(node.readyStatus.map(String.init) ?? "-")\n    \(tail)"
        }.joined(separator: "\n")
    }

    private func start(_ node: Node) throws {
        let arguments = Self.arguments(
            topology: topology, redisURL: redisInstances.map { $0.url("/0") }.joined(separator: ","), leaseTTL: leaseTTL, devicePort: node.devicePort,
            adminPort: node.adminPort, tls: node.tlsPort.flatMap { port in certificates.map { (port: port, certificates: $0) } }, extra: extraArguments)
        // Every role starts its admin API first (a standby or front its own, the home the
        // server's), so that line says the process is up whatever its role.
        node.process = try ServerProcess(arguments, until: "admin_listening")
    }

    private func waitFor(_ what: String, timeoutSeconds: Double, _ condition: () -> Bool) throws {
        let clock = SystemClock()
        let deadline = clock.now() + .milliseconds(Int64(timeoutSeconds * 1000))
        while !condition() {
            guard clock.now() < deadline else { throw TestFailure("timed out after \(timeoutSeconds) s waiting for \(what)\n\(describe())") }
            clock.sleep(until: clock.now() + .milliseconds(20))
        }
    }
}
