import SQLiteStoreFixtures
import SignalingProtocol
import SignalingStore
import SignalingStoreSQLite
import TestSupport
import Testing

/// A store in its own temporary directory, with the reference model beside it
/// (`ModelledStoreHarness`).
final class StoreHarness: ModelledStoreHarness<SQLiteEventStore> {
    let directory: TemporaryDirectory
    private var configuration: SQLiteStoreConfiguration

    /// The store lives in `data` inside a fresh temporary directory, or in `dataDirectory`.
    init(dataDirectory: String? = nil, synchronous: SQLiteStoreConfiguration.Synchronous = .normal,
         maxPageCount: Int? = nil) throws {
        directory = try TemporaryDirectory()
        configuration = SQLiteStoreConfiguration(
            directory: dataDirectory ?? directory.file("data"), synchronous: synchronous, maxPageCount: maxPageCount)
        super.init(store: try SQLiteEventStore(configuration: configuration))
    }

    /// Closes the store and opens the same directory again.
    func reopen() throws {
        store.close()
        store = try SQLiteEventStore(configuration: configuration)
    }

    /// Reopens with another size cap (nil: none).
    func reopen(maxPageCount: Int?) throws {
        configuration.maxPageCount = maxPageCount
        try reopen()
    }
}
