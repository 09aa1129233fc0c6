import SQLiteStoreFixtures
import SignalingStore
import Testing

/// A store under test with the reference model beside it: every batch goes to both, and
/// `verify` compares the store's snapshot with the model's. Each store's harness
/// (SQLite, Redis) subclasses it with how to open and reopen its store.
open class ModelledStoreHarness<Store: EventStore> {
    /// Replaced by a subclass when it reopens the store.
    public var store: Store
    public private(set) var reference = ReferenceStore()

    public init(store: Store) {
        self.store = store
    }

    deinit {
        store.close()
    }

    /// Applies a batch the store must accept, and records it in the model.
    public func apply(_ changes: [StoreChange]) throws(StoreError) {
        try store.apply(changes)
        reference.apply(changes)
    }

    /// Records a batch in the model only (the store applied it by other means).
    public func model(_ changes: [StoreChange]) {
        reference.apply(changes)
    }

    /// Applies a batch the store must refuse; the model is left alone. Returns the error.
    public func applyFailing(_ changes: [StoreChange], sourceLocation: SourceLocation = #_sourceLocation) -> StoreError? {
        #expect(throws: StoreError.self, sourceLocation: sourceLocation) { try self.store.apply(changes) }
    }

    /// Checks that the store holds exactly what the model says; returns the snapshot.
    @discardableResult
    public func verify(sourceLocation: SourceLocation = #_sourceLocation) throws -> StoredSnapshot {
        let snapshot = try store.loadSnapshot()
        #expect(snapshot == reference.snapshot, sourceLocation: sourceLocation)
        return snapshot
    }
}
