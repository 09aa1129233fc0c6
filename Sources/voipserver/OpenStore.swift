import SignalingServer
import SignalingStore
import SignalingStoreRedis
import SignalingStoreSQLite
import SignalingSupport

// The executable composes the server with its store: SignalingServer knows only the
// EventStore protocol, so the stores plug in here.
extension StorageConfiguration {
    /// Opens the configured store: nil for `.memory`, else the SQLite or the Redis store.
    func openStore(logger: Logger) throws(StoreError) -> (any EventStore)? {
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
            let endpoint = try RedisEndpoint(url: redisURL ?? "")
            let fsync: RedisStoreConfiguration.Fsync = redisFsync == .always ? .always : .everysec
            return try RedisEventStore(
                configuration: RedisStoreConfiguration(endpoint: endpoint, requiredFsync: fsync, allowVolatile: redisAllowVolatile),
                logger: logger)
        }
    }
}
