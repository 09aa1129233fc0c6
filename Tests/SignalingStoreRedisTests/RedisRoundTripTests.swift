import SQLiteStoreFixtures
import SignalingProtocol
import SignalingStore
@testable import SignalingStoreRedis
import TestSupport
import Testing

/// Every StoreChange applied to the Redis store and read back, before and after reopening,
/// against the same reference model as the SQLite store.
@Suite("Redis store: every change round-trips", redisAvailable)
struct RedisRoundTripTests {
    @Test("the deterministic batches of the SQLite tests leave the reference model's snapshot", arguments: instanceCounts)
    func deterministicBatches(instances: Int) throws {
        let harness = try RedisStoreHarness(instances: instances)
        for number in 0..<40 {
            try harness.apply(CrashWorkload.batch(number))
            if number % 10 == 0 { try harness.verify() }
        }
        try harness.reopen()
        let snapshot = try harness.verify()
        #expect(snapshot.devices.count == CrashWorkload.devices.count)
        #expect(snapshot.held["frank"]?.isEmpty == false)
        #expect(!snapshot.messageIDs.isEmpty)
    }

    @Test("each kind of change: upsert, append, acknowledge, reserve, remove, hold, claim, release, withdraw, ids, push", arguments: instanceCounts)
    func everyKind(instances: Int) throws {
        let harness = try RedisStoreHarness(instances: instances)
        let receipt = StoredReceipt(sender: "bob", messageID: "m-1", recipient: "alice")
        try harness.apply([
            Sample.device("alice", "phone", session: 1, lastSeen: 100), Sample.device("alice", "tablet"),
            Sample.append("alice", "phone", 2),
            .appendEvent(user: "alice", device: "phone", event: Sample.event(1, receipt: receipt)),
            Sample.append("alice", "phone", 3), Sample.append("alice", "tablet", 1),
            .registerPush(user: "alice", device: "phone", registration: PushRegistration(platform: "apns", token: [1, 2])),
            .holdForUser(user: "carol", event: Sample.event(2)),
            .holdForUser(user: "carol", event: Sample.event(1, receipt: receipt)),
            .holdForUser(user: "dave", event: Sample.event(1)),
            .rememberMessageID(StoredMessageID(sender: "bob", messageID: "m1", serverTime: 10, expiresAt: 20)),
            .rememberMessageID(StoredMessageID(sender: "bob", messageID: "m2", serverTime: 11, expiresAt: 21)),
        ])
        try harness.verify()
        try harness.apply([
            .acknowledge(user: "alice", device: "phone", through: 2),
            .acknowledge(user: "alice", device: "phone", through: 1),  // never lowers
            .reserveSequence(user: "alice", device: "phone", through: 70),
            Sample.device("alice", "phone", session: 2, lastSeen: 200),
            .registerPush(user: "alice", device: "phone", registration: PushRegistration(platform: "fcm", token: [9])),
            .registerPush(user: "alice", device: "phone", registration: PushRegistration(
                platform: "apns-voip", token: [7], environment: "sandbox", topic: "com.example.app")),
            .registerPush(user: "alice", device: "phone", registration: PushRegistration(platform: "fcm", token: [10])),
            .removePush(user: "alice", device: "phone", kind: .apns),
            .removePush(user: "alice", device: "phone", kind: .webhook),  // none: nothing happens
            .registerPush(user: "alice", device: "tablet", registration: PushRegistration(platform: "my-gateway", token: [3])),
            .removeDevice(user: "alice", device: "tablet"),
            Sample.device("carol", "laptop"),
            .claimHeldEvent(user: "carol", device: "laptop", seq: 1, ordinal: 1),
            .claimHeldEvent(user: "carol", device: "laptop", seq: 2, ordinal: 2),
            .claimHeldEvent(user: "carol", device: "laptop", seq: 3, ordinal: 9),  // not held: only raises lastSeq
            .releaseHeld(user: "carol", through: 2),
            .withdrawEvent(user: "alice", device: "phone", seq: 3),
            .withdrawEvent(user: "alice", device: "phone", seq: 90),
            .withdrawHeld(user: "dave", ordinal: 1),
            .rememberMessageID(StoredMessageID(sender: "bob", messageID: "m1", serverTime: 30, expiresAt: 40)),
            .forgetMessageID(sender: "bob", messageID: "m2", serverTime: 11),
            .forgetMessageID(sender: "nobody", messageID: "never", serverTime: 1),
        ])
        try harness.reopen()
        let snapshot = try harness.verify()
        let phone = try #require(snapshot.devices.first { $0.deviceID == "phone" })
        // No event left: every number up to lastSeq counts as acknowledged (StoredDevice.ackedSeq).
        #expect(phone.events.isEmpty && phone.ackedSeq == 90 && phone.lastSeq == 90)
        #expect(phone.sessionID == Sample.session(2) && phone.lastSeen == 200)
        #expect(phone.pushRegistrations == [
            PushRegistration(platform: "apns-voip", token: [7], environment: "sandbox", topic: "com.example.app"),
            PushRegistration(platform: "fcm", token: [10]),
        ], "one per kind, in kind order; the apns one removed")
        #expect(!snapshot.devices.contains { $0.deviceID == "tablet" })
        let laptop = try #require(snapshot.devices.first { $0.userID == "carol" })
        #expect(laptop.events.map(\.seq) == [1, 2] && laptop.events[0].receipt == receipt && laptop.lastSeq == 3)
        #expect(snapshot.held.isEmpty, "carol's were released, dave's withdrawn")
        #expect(snapshot.messageIDs == [StoredMessageID(sender: "bob", messageID: "m1", serverTime: 30, expiresAt: 40)])

        // A user with nothing left leaves the index; a removed device starts afresh.
        try harness.apply([.removeDevice(user: "carol", device: "laptop"), Sample.device("alice", "tablet", session: 7)])
        #expect(try harness.indexedUsers() == ["alice", "bob"])
        let tablet = try #require(try harness.verify().devices.first { $0.deviceID == "tablet" })
        #expect(tablet.events.isEmpty && tablet.lastSeq == 0 && tablet.pushRegistrations.isEmpty)
    }

    @Test("edge values round-trip: 64 KiB and empty bodies, ids with } % : and NUL, extreme numbers", arguments: instanceCounts)
    func edgeValues(instances: Int) throws {
        let harness = try RedisStoreHarness(instances: instances)
        let big = Sample.bigEvent, empty = Sample.emptyEvent
        // Ids that would collide in keys without escaping: user "x}:q:y" device "d" and
        // user "x" device "y}:q:d"; and a user named like an escape.
        try harness.apply(Sample.edgeValues + [
            Sample.device("x}:q:y", "d"), Sample.device("x", "y}:q:d"), Sample.device("%7D", "d"), Sample.device("}", "d"),
            Sample.append("x}:q:y", "d", 1), Sample.append("x", "y}:q:d", 2), Sample.append("%7D", "d", 3), Sample.append("}", "d", 4),
        ])
        try harness.reopen()
        let snapshot = try harness.verify()
        let zoe = try #require(snapshot.devices.first { $0.userID == "zoë 👋" })
        #expect(zoe.events == [big, empty])
        #expect(zoe.lastSeq == UInt64(Int64.max))
        #expect(snapshot.devices.first { $0.userID == "x" }?.events.map(\.seq) == [2])
        #expect(snapshot.devices.first { $0.userID == "x}:q:y" }?.events.map(\.seq) == [1])
    }

    @Test("bodies(...) pages through a device's events in seq order from a given seq", arguments: instanceCounts)
    func bodiesPages(instances: Int) throws {
        let harness = try RedisStoreHarness(instances: instances)
        try harness.apply([Sample.device("bob", "phone")] + (1...150).map { Sample.append("bob", "phone", $0, bodySize: 100) })
        try harness.apply([.acknowledge(user: "bob", device: "phone", through: 10)])
        var from: UInt64 = 1
        var seen: [UInt64] = []
        while true {
            let page = try harness.store.bodies(user: "bob", device: "phone", from: from, limit: 64)
            guard let last = page.last else { break }
            #expect(page.count <= 64)
            for entry in page { #expect(entry.body == Sample.event(entry.seq, bodySize: 100).body) }
            seen += page.map(\.seq)
            from = last.seq + 1
        }
        #expect(seen == Array(11...150))
        #expect(try harness.store.bodies(user: "bob", device: "phone", from: 140, limit: 3).map(\.seq) == [140, 141, 142])
        #expect(try harness.store.bodies(user: "nobody", device: "phone", from: 1, limit: 64).isEmpty)
    }

    @Test("an empty batch changes nothing and sends nothing", arguments: instanceCounts)
    func emptyBatch(instances: Int) throws {
        let harness = try RedisStoreHarness(instances: instances)
        try harness.apply([Sample.device("alice", "phone")])
        try harness.apply([])
        #expect(try harness.verify().devices.count == 1)
    }
}
