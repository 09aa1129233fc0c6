import SignalingServer
import SignalingStore
import SignalingStoreRedis
import SignalingStoreSQLite
import SignalingSupport

// The executable composes the server with its store: SignalingServer knows only the
// EventStore protocol, so the stores plug in here.
extension StorageConfiguration {
    /// Opens the configured store: nil for `.memory`, else the SQLite or the Redis store.
    /// `fencingToken`: the Redis store then writes only while the lease holds it.
    func openStore(logger: Logger, fencingToken: String? = nil) throws(StoreError) -> (any EventStore)? {
        switch mode {
        case .memory:
            return nil
        case .sqlite:
            let pageSize = 4096
            let synchronous: SQLiteStoreConfiguration.Synchronous = self.synchronous == .full ? .full : .normal
            return try SQLiteEventStore(
                configuration: SQLiteStoreConfiguration(
                    directory: directory, synchronous: synchronous,
                    maxPageCount: maxBytes.map { max(1, $0 / pageSize) }),
                logger: logger)
        case .redis:
            let endpoints = try RedisEndpoint.list(redisURL ?? "")
            let fsync: RedisStoreConfiguration.Fsync = redisFsync == .always ? .always : .everysec
            return try RedisEventStore(
                configuration: RedisStoreConfiguration(
                    endpoints: endpoints, requiredFsync: fsync, allowVolatile: redisAllowVolatile, fencingToken: fencingToken),
                logger: logger)
        }
    }
}

/// What runs: one server, or with a Redis store a node that serves only while it holds the
/// database's lease (docs/CLUSTER.md).
enum Node {
    case single(SignalingServer)
    case leased(LeasedNode)

    /// Opens the store and starts. With Redis the store is opened once here to check Redis
    /// (its AOF, the layout version), so a misconfigured node fails at start as a single
    /// one does, then closed again: each active term opens its own, fenced.
    static func start(_ configuration: ServerConfiguration, logger: Logger) throws -> Node {
        let storage = configuration.storage
        guard storage.mode == .redis else {
            let server = try SignalingServer(configuration: configuration, logger: logger, store: try storage.openStore(logger: logger))
            try server.start()
            return .single(server)
        }
        try storage.openStore(logger: logger)?.close()
        // The lease, and by default the node link, live on the first instance (docs/CLUSTER.md).
        let endpoint = try RedisEndpoint.list(storage.redisURL ?? "")[0]
        let lease = RedisLease(endpoint: endpoint, ttl: storage.redisLeaseTTL)
        // A cluster member (--cluster) serves devices in every role: it needs the link
        // between the nodes (docs/CLUSTER.md, "Fronts").
        let link: (any NodeLink)? =
            storage.cluster
            ? try RedisNodeLink(
                endpoint: try storage.clusterLinkURL.map { url throws(StoreError) in try RedisEndpoint(url: url) } ?? endpoint,
                presenceTTL: storage.redisLeaseTTL, logger: logger)
            : nil
        let node = LeasedNode(configuration: configuration, lease: lease, logger: logger, link: link) { token throws(StoreError) -> any EventStore in
            guard let store = try storage.openStore(logger: logger, fencingToken: token) else {
                throw StoreError(.other, "no store configured")
            }
            return store
        }
        node.start()
        return .leased(node)
    }

    /// systemd's status line: where devices connect, or that the node is a standby (at
    /// start and after a reload; /readyz and the log follow the role as it changes).
    var status: String {
        switch self {
        case .single(let server): return "listening on \(server.listeningDescription)"
        case .leased(let node):
            return node.role == .active ? "active, listening on \(node.listeningDescription)" : node.listeningDescription
        }
    }

    func reload(_ configuration: ServerConfiguration) {
        switch self {
        case .single(let server): server.reload(configuration)
        case .leased(let node): node.reload(configuration)
        }
    }

    func shutdown() {
        switch self {
        case .single(let server): server.shutdown()
        case .leased(let node): node.stop()
        }
    }

    var configuration: ServerConfiguration {
        switch self {
        case .single(let server): return server.configuration
        case .leased(let node): return node.configuration
        }
    }
}
