import SQLiteStoreFixtures
import SignalingProtocol
import SignalingStore
@testable import SignalingStoreRedis
import TestSupport
import Testing

/// A Redis store on a real `redis-server` of its own, with the reference model beside it
/// (`ModelledStoreHarness`).
final class RedisStoreHarness: ModelledStoreHarness<RedisEventStore> {
    let redis: RedisServer
    let configuration: RedisStoreConfiguration

    init(settings: [String] = RedisServer.durable, configure: (inout RedisStoreConfiguration) -> Void = { _ in }) throws {
        redis = try RedisServer(settings: settings)
        var configuration = RedisStoreConfiguration(endpoint: try RedisEndpoint(url: redis.url()))
        configure(&configuration)
        self.configuration = configuration
        super.init(store: try RedisEventStore(configuration: configuration))
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
