import SQLiteStoreFixtures
import SignalingProtocol
import SignalingStore
@testable import SignalingStoreRedis
import SignalingSupport
import TestSupport
import Testing

/// A Redis store on a real `redis-server` of its own, with the reference model beside it
/// (`ModelledStoreHarness`).
final class RedisStoreHarness: ModelledStoreHarness<RedisEventStore> {
    /// The store's instances, in the configuration's order (one: the unsharded store).
    let servers: [RedisServer]
    var redis: RedisServer { servers[0] }
    let configuration: RedisStoreConfiguration

    /// - Parameter instances: how many `redis-server`s the store spreads its users over.
    init(instances: Int = 1, settings: [String] = RedisServer.durable, configure: (inout RedisStoreConfiguration) -> Void = { _ in }) throws {
        servers = try (0..<instances).map { _ in try RedisServer(settings: settings) }
        var configuration = RedisStoreConfiguration(endpoints: try servers.map { try RedisEndpoint(url: $0.url()) })
        configure(&configuration)
        self.configuration = configuration
        super.init(store: try RedisEventStore(configuration: configuration))
    }

    /// Closes the store and opens it again on the same Redis instances.
    func reopen() throws {
        store.close()
        store = try RedisEventStore(configuration: configuration)
    }

    /// A connection of the test's own to the first instance, for looking at and tampering with what Redis holds.
    func connection() throws -> RedisConnection {
        try connection(instance: 0)
    }

    func connection(instance: Int) throws -> RedisConnection {
        try RedisConnection(endpoint: configuration.endpoints[instance], timeoutMilliseconds: 5_000)
    }

    /// A connection to the instance that holds `user`'s keys.
    func connection(forUser user: String) throws -> RedisConnection {
        try connection(instance: RedisShards.instance(ofUser: user, count: servers.count))
    }

    /// Applies `batch` until the store accepts it or `seconds` pass (a Redis instance just
    /// restarted: the store's reconnect back-off decides when it is tried again). Returns
    /// whether it was accepted.
    func applyOnceReachable(_ batch: [StoreChange], within seconds: Int64 = 10) -> Bool {
        let clock = SystemClock()
        let deadline = clock.now() + .seconds(seconds)
        while clock.now() < deadline {
            if (try? store.apply(batch)) != nil { return true }
            clock.sleep(until: clock.now() + .milliseconds(20))
        }
        return false
    }

    /// The users in `voip:users` of every instance.
    func indexedUsers() throws -> Set<String> {
        var users = Set<String>()
        for instance in servers.indices {
            guard case .array(let members) = try connection(instance: instance).run(RedisCommand("SMEMBERS", RedisLayout.usersKey)) else {
                continue
            }
            users.formUnion(members.compactMap(\.text))
        }
        return users
    }
}

/// The conformance and behaviour tests run against the store on one Redis and spread over three.
let instanceCounts = [1, 3]

/// Tests that need `redis-server` run only where it is installed (Tools/ensure-deps).
let redisAvailable = Testing.ConditionTrait.enabled(if: RedisServer.isAvailable, "redis-server is not installed")
