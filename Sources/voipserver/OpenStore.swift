import SignalingServer
import SignalingStore
import SignalingStoreSQLite
import SignalingSupport

// The executable composes the server with its store: SignalingServer knows only the
// EventStore protocol, so another store (Redis, for a cluster) plugs in here.
extension StorageConfiguration {
    /// Opens the configured store: nil for `.memory`, else the SQLite store.
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
        }
    }
}
