import SQLiteStoreFixtures
import SignalingProtocol
import SignalingStore
import SignalingStoreSQLite
import TestSupport
import Testing

/// A store in its own temporary directory, with the reference model beside it: every batch
/// goes to both, and `verify` compares the store's snapshot with the model's.
final class StoreHarness {
    let directory: TemporaryDirectory
    private(set) var store: SQLiteEventStore
    private(set) var reference = ReferenceStore()
    private var configuration: SQLiteStoreConfiguration

    /// The store lives in `data` inside a fresh temporary directory, or in `dataDirectory`.
    init(dataDirectory: String? = nil, synchronous: SQLiteStoreConfiguration.Synchronous = .normal,
         maxPageCount: Int? = nil) throws {
        directory = try TemporaryDirectory()
        configuration = SQLiteStoreConfiguration(
            directory: dataDirectory ?? directory.file("data"), synchronous: synchronous, maxPageCount: maxPageCount)
        store = try SQLiteEventStore(configuration: configuration)
    }

    deinit {
        store.close()
    }

    /// Applies a batch the store must accept, and records it in the model.
    func apply(_ changes: [StoreChange]) throws(StoreError) {
        try store.apply(changes)
        reference.apply(changes)
    }

    /// Applies a batch the store must refuse; the model is left alone. Returns the error.
    func applyFailing(_ changes: [StoreChange], sourceLocation: SourceLocation = #_sourceLocation) -> StoreError? {
        #expect(throws: StoreError.self, sourceLocation: sourceLocation) { try self.store.apply(changes) }
    }

    /// Checks that the store holds exactly what the model says; returns the snapshot.
    @discardableResult
    func verify(sourceLocation: SourceLocation = #_sourceLocation) throws -> StoredSnapshot {
        let snapshot = try store.loadSnapshot()
        #expect(snapshot == reference.snapshot, sourceLocation: sourceLocation)
        return snapshot
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
