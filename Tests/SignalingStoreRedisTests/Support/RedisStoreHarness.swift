import SQLiteStoreFixtures
import SignalingProtocol
import SignalingStore
@testable import SignalingStoreRedis
import TestSupport
import Testing

/// A Redis store on a real `redis-server` of its own, with the reference model beside it:
/// every batch goes to both, and `verify` compares the store's snapshot with the model's.
final class RedisStoreHarness {
    let redis: RedisServer
    private(set) var store: RedisEventStore
    private(set) var reference = ReferenceStore()
    let configuration: RedisStoreConfiguration

    init(settings: [String] = RedisServer.durable, configure: (inout RedisStoreConfiguration) -> Void = { _ in }) throws {
        redis = try RedisServer(settings: settings)
        var configuration = RedisStoreConfiguration(endpoint: try RedisEndpoint(url: redis.url()))
        configure(&configuration)
        self.configuration = configuration
        store = try RedisEventStore(configuration: configuration)
    }

    deinit {
        store.close()
    }

    /// Applies a batch the store must accept, and records it in the model.
    func apply(_ changes: [StoreChange]) throws(StoreError) {
        try store.apply(changes)
        reference.apply(changes)
    }

    /// Records a batch in the model only (it was applied by other means).
    func model(_ changes: [StoreChange]) {
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

    /// Closes the store and opens it again on the same Redis.
    func reopen() throws {
        store.close()
        store = try RedisEventStore(configuration: configuration)
    }

    /// A connection of the test's own, for looking at and tampering with what Redis holds.
    func connection() throws -> RedisConnection {
        try RedisConnection(endpoint: configuration.endpoint, timeoutMilliseconds: 5_000)
    }
}

/// Tests that need `redis-server` run only where it is installed (Tools/ensure-deps).
let redisAvailable = Testing.ConditionTrait.enabled(if: RedisServer.isAvailable, "redis-server is not installed")
