import SQLiteStoreFixtures
import SignalingProtocol
import SignalingStore
@testable import SignalingStoreRedis
import TestSupport
import Testing

/// A batch is all or nothing, and applying it again (the store writer's retry after a
/// reply it did not get) changes nothing more.
@Suite("Redis store: batches are atomic and idempotent", redisAvailable)
struct RedisAtomicityTests {
    /// Changes for several users, with `bob`'s in the middle.
    private func spanningBatch() -> [StoreChange] {
        [
            Sample.append("alice", "phone", 2),
            .rememberMessageID(StoredMessageID(sender: "alice", messageID: "m", serverTime: 1, expiresAt: 2)),
            Sample.append("bob", "phone", 1),
            .holdForUser(user: "carol", event: Sample.event(1)),
            Sample.append("alice", "phone", 3),
        ]
    }

    @Test("a key of the wrong type midway fails the whole batch before anything is written; fixed, it goes through")
    func wrongTypeMidway() throws {
        // One instance: a batch over several is atomic per instance only (RedisShardedStoreTests).
        let harness = try RedisStoreHarness()
        try harness.apply([Sample.device("alice", "phone"), Sample.device("bob", "phone"), Sample.append("alice", "phone", 1)])
        // Another program wrote bob's queue as a string.
        let tamper = try harness.connection()
        let queue = RedisLayout.queueKey("bob", "phone")
        var set = RedisCommand("SET")
        set.append(queue)
        set.append("not a queue")
        #expect(try tamper.run(set) == .status("OK"))

        let error = harness.applyFailing(spanningBatch())
        #expect(error?.kind == .corrupt)
        #expect(error?.message.contains("q:phone is a string, not a zset") == true, "\(String(describing: error))")
        // The snapshot cannot be read past such a key either.
        #expect(throws: StoreError.self) { try harness.store.loadSnapshot() }

        var delete = RedisCommand("DEL")
        delete.append(queue)
        #expect(try tamper.run(delete) == .integer(1))
        try harness.verify()  // none of the batch: not alice's changes before bob's, not carol's after
        try harness.apply(spanningBatch())
        try harness.verify()
    }

    @Test("a damaged device record fails the batch before anything is written")
    func damagedRecord() throws {
        // One instance: a batch over several is atomic per instance only (RedisShardedStoreTests).
        let harness = try RedisStoreHarness()
        try harness.apply([Sample.device("alice", "phone"), Sample.device("bob", "phone")])
        var damage = RedisCommand("HSET")
        damage.append(RedisLayout.devicesKey("bob"))
        damage.append("phone")
        damage.append("short")
        #expect(try harness.connection().run(damage) == .integer(0))
        let error = harness.applyFailing(spanningBatch())
        #expect(error?.kind == .corrupt)
        #expect(throws: StoreError.self) { try harness.store.loadSnapshot() }
    }

    @Test("a number the store refuses (beyond 2^63 - 1) fails the batch, naming the change, before anything is sent", arguments: instanceCounts)
    func numberOutOfRange(instances: Int) throws {
        let harness = try RedisStoreHarness(instances: instances)
        try harness.apply([Sample.device("alice", "phone")])
        for invalid: StoreChange in [
            Sample.append("alice", "phone", UInt64(Int64.max) + 1),
            .acknowledge(user: "alice", device: "phone", through: .max),
            .holdForUser(user: "carol", event: Sample.event(.max)),
        ] {
            let batch = [Sample.append("alice", "phone", 1), invalid, Sample.append("alice", "phone", 2)]
            let error = harness.applyFailing(batch)
            #expect(error?.kind == .other)
            #expect(error?.message.hasPrefix("change 2 of 3") == true, "\(String(describing: error))")
            try harness.verify()
        }
    }

    @Test("every deterministic batch applied twice in a row leaves what applying it once does", arguments: instanceCounts)
    func retriedBatchesAreIdempotent(instances: Int) throws {
        let harness = try RedisStoreHarness(instances: instances)
        for number in 0..<25 {
            let batch = CrashWorkload.batch(number)
            try harness.apply(batch)
            try harness.store.apply(batch)  // the retry of a batch whose reply was lost
        }
        try harness.verify()
    }

    @Test("a retried batch that removes a device after changing it, or claims and releases held events, is idempotent", arguments: instanceCounts)
    func retriedRemovalsAndClaims(instances: Int) throws {
        let harness = try RedisStoreHarness(instances: instances)
        try harness.apply([
            Sample.device("alice", "phone"), Sample.device("alice", "old"), Sample.append("alice", "old", 1),
            .holdForUser(user: "bob", event: Sample.event(1)), .holdForUser(user: "bob", event: Sample.event(2)),
        ])
        let batch: [StoreChange] = [
            Sample.append("alice", "old", 2),
            .registerPush(user: "alice", device: "old", registration: PushRegistration(platform: "fcm", token: [1])),
            .removeDevice(user: "alice", device: "old"),
            Sample.append("alice", "phone", 1),
            Sample.device("bob", "phone"),
            .claimHeldEvent(user: "bob", device: "phone", seq: 1, ordinal: 1),
            .claimHeldEvent(user: "bob", device: "phone", seq: 2, ordinal: 2),
            .releaseHeld(user: "bob", through: 2),
            .holdForUser(user: "carol", event: Sample.event(5)),
            .withdrawHeld(user: "carol", ordinal: 5),
        ]
        try harness.apply(batch)
        let once = try harness.verify()
        try harness.store.apply(batch)
        #expect(try harness.verify() == once)
        #expect(once.devices.first { $0.userID == "bob" }?.events.map(\.seq) == [1, 2], "the claimed copies survive the retry")
    }
}
