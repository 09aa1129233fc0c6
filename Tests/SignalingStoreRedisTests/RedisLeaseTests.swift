import SQLiteStoreFixtures
import SignalingStore
@testable import SignalingStoreRedis
import SignalingSupport
import TestSupport
import Testing

/// The lease that makes one node the writer of a Redis database, and the fencing check in
/// the batch script that makes Redis itself refuse a node that lost it (docs/CLUSTER.md).
@Suite("Redis store: the lease and fencing", redisAvailable)
struct RedisLeaseTests {
    @Test("one node holds the lease: a second cannot take, refresh or release it; released, the second takes it")
    func exclusiveLease() throws {
        let redis = try RedisServer()
        let endpoint = try RedisEndpoint(url: redis.url())
        let first = RedisLease(endpoint: endpoint, ttl: .seconds(30), ownerIDs: { "node-a" })
        let second = RedisLease(endpoint: endpoint, ttl: .seconds(30), ownerIDs: { "node-b" })
        #expect(try first.acquire())
        #expect(try !first.acquire(), "a take is always new, even by the holder")
        #expect(try !second.acquire())
        #expect(try !second.refresh())
        second.release()
        #expect(first.holder() == "node-a", "an owner-checked release leaves another node's lease alone")
        #expect(try first.refresh())
        first.release()
        #expect(first.holder() == nil)
        #expect(try !first.refresh(), "a released lease is not extended")
        #expect(try second.acquire())
        #expect(second.holder() == "node-b")
    }

    @Test("every take of the lease has an id of its own, so each term fences with its own token")
    func newIDPerTake() throws {
        let redis = try RedisServer()
        let lease = RedisLease(endpoint: try RedisEndpoint(url: redis.url()), ttl: .seconds(30))
        #expect(try lease.acquire())
        let first = lease.ownerID
        #expect(lease.holder() == first)
        lease.release()
        #expect(try lease.acquire())
        #expect(lease.ownerID != first && lease.holder() == lease.ownerID)
    }

    @Test("a lease that is not refreshed expires in Redis, and another node takes it")
    func leaseExpires() throws {
        let redis = try RedisServer()
        let endpoint = try RedisEndpoint(url: redis.url())
        let first = RedisLease(endpoint: endpoint, ttl: .milliseconds(300), ownerIDs: { "node-a" })
        let second = RedisLease(endpoint: endpoint, ttl: .seconds(30), ownerIDs: { "node-b" })
        #expect(try first.acquire())
        let clock = SystemClock()
        let deadline = clock.now() + .seconds(10)
        var taken = false
        while !taken && clock.now() < deadline {
            taken = try second.acquire()
            if !taken { clock.sleep(until: clock.now() + .milliseconds(20)) }
        }
        #expect(taken)
        #expect(try !first.refresh(), "the first node learns that it lost the lease")
    }

    @Test("fencing: a store writes while its node holds the lease; once another node holds it, Redis refuses the whole batch")
    func fencedBatchIsRefused() throws {
        let redis = try RedisServer()
        let endpoint = try RedisEndpoint(url: redis.url())
        let first = RedisLease(endpoint: endpoint, ttl: .seconds(30), ownerIDs: { "node-a" })
        #expect(try first.acquire())
        let store = try RedisEventStore(configuration: RedisStoreConfiguration(endpoint: endpoint, fencingToken: "node-a"))
        try store.apply([Sample.device("alice", "phone"), Sample.append("alice", "phone", 1)])

        // node-a stalls past its lease; node-b takes over and writes.
        let connection = try RedisConnection(endpoint: endpoint, timeoutMilliseconds: 5_000)
        _ = try connection.run(RedisCommand("DEL", RedisLayout.leaseKey))
        let second = RedisLease(endpoint: endpoint, ttl: .seconds(30), ownerIDs: { "node-b" })
        #expect(try second.acquire())
        let successor = try RedisEventStore(configuration: RedisStoreConfiguration(endpoint: endpoint, fencingToken: "node-b"))
        try successor.apply([Sample.append("alice", "phone", 2)])

        // node-a's late batch: refused by Redis, none of it written.
        var refusal: StoreError?
        do {
            try store.apply([Sample.append("alice", "phone", 3), Sample.device("bob", "laptop")])
        } catch {
            refusal = error
        }
        #expect(refusal?.message.contains("VSFENCED") == true, "\(String(describing: refusal))")
        #expect(refusal?.message.contains("node-b") == true, "the refusal names the holder")
        let snapshot = try successor.loadSnapshot()
        #expect(snapshot.devices.map(\.userID) == ["alice"])
        #expect(snapshot.devices.first?.events.map(\.seq) == [1, 2])

        // With no lease at all (expired, nobody took it), a fenced store writes nothing either.
        second.release()
        #expect(throws: StoreError.self) { try successor.apply([Sample.append("alice", "phone", 4)]) }
    }

    @Test("a database that holds only the lease counts as empty when the store first opens it")
    func leaseBeforeFirstOpen() throws {
        let redis = try RedisServer()
        let endpoint = try RedisEndpoint(url: redis.url())
        #expect(try RedisLease(endpoint: endpoint, ttl: .seconds(30), ownerIDs: { "node-a" }).acquire())
        let store = try RedisEventStore(configuration: RedisStoreConfiguration(endpoint: endpoint, fencingToken: "node-a"))
        try store.apply([Sample.device("alice", "phone")])
        #expect(try store.loadSnapshot().devices.count == 1)
    }
}
