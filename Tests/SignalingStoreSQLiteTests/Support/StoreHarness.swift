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

/// Records for tests, with defaults so each test spells out only what it is about.
enum Sample {
    static func session(_ n: UInt64) -> SessionID { SessionID(high: n, low: ~n) }

    static func event(_ seq: UInt64, bodySize: Int = 24, receipt: StoredReceipt? = nil, createdAt: UInt64 = 1_800_000_000_000) -> StoredEvent {
        StoredEvent(seq: seq, type: 0x41, body: (0..<bodySize).map { UInt8(truncatingIfNeeded: seq &* 31 &+ UInt64($0)) },
                    receipt: receipt, createdAt: createdAt)
    }

    static func device(_ user: String, _ device: String, session: UInt64 = 1, lastSeen: UInt64 = 1_800_000_000_000) -> StoreChange {
        .upsertDevice(user: user, device: device, sessionID: Sample.session(session), lastSeen: lastSeen)
    }

    static func append(_ user: String, _ device: String, _ seq: UInt64, bodySize: Int = 24) -> StoreChange {
        .appendEvent(user: user, device: device, event: event(seq, bodySize: bodySize))
    }
}
