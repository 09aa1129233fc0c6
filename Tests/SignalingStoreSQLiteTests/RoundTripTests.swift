import Foundation
import SQLiteStoreFixtures
import SignalingProtocol
import SignalingStore
import SignalingStoreSQLite
import Testing

/// Every StoreChange, applied and read back, before and after reopening the file. Each test
/// checks the snapshot against the reference model and spells out the values it is about.
@Suite("SQLite store: every change round-trips")
struct RoundTripTests {
    @Test("upsertDevice creates a device, then updates only its session and last-seen time")
    func upsertDevice() throws {
        let harness = try StoreHarness()
        try harness.apply([Sample.device("alice", "phone", session: 1, lastSeen: 100)])
        try harness.apply([
            .registerPush(user: "alice", device: "phone", registration: PushRegistration(platform: "apns", token: [1, 2])),
            Sample.append("alice", "phone", 1),
            .acknowledge(user: "alice", device: "phone", through: 1),
        ])
        try harness.apply([Sample.device("alice", "phone", session: 2, lastSeen: 200)])
        try harness.verify()
        try harness.reopen()
        let device = try #require(try harness.verify().devices.first)
        #expect(device.sessionID == Sample.session(2))
        #expect(device.lastSeen == 200)
        #expect(device.ackedSeq == 1 && device.lastSeq == 1)
        #expect(device.pushRegistrations == [PushRegistration(platform: "apns", token: [1, 2])])
    }

    @Test("appendEvent stores the event and raises lastSeq; events come back in seq order")
    func appendEvent() throws {
        let harness = try StoreHarness()
        let receipt = StoredReceipt(sender: "bob", messageID: "m-1", recipient: "alice")
        try harness.apply([
            Sample.device("alice", "phone"),
            Sample.append("alice", "phone", 2),
            .appendEvent(user: "alice", device: "phone", event: Sample.event(1, receipt: receipt)),
            Sample.append("alice", "phone", 3),
        ])
        try harness.verify()
        try harness.reopen()
        let device = try #require(try harness.verify().devices.first)
        #expect(device.events.map(\.seq) == [1, 2, 3])
        #expect(device.events[0].receipt == receipt)
        #expect(device.events[1].receipt == nil)
        #expect(device.lastSeq == 3)
    }

    @Test("acknowledge deletes the events up to its seq and never lowers ackedSeq")
    func acknowledge() throws {
        let harness = try StoreHarness()
        try harness.apply([Sample.device("alice", "phone")] + (1...5).map { Sample.append("alice", "phone", $0) })
        try harness.apply([.acknowledge(user: "alice", device: "phone", through: 3)])
        try harness.apply([.acknowledge(user: "alice", device: "phone", through: 2)])
        try harness.verify()
        try harness.reopen()
        let device = try #require(try harness.verify().devices.first)
        #expect(device.events.map(\.seq) == [4, 5])
        #expect(device.ackedSeq == 3)
        #expect(device.lastSeq == 5)
    }

    @Test("a device's acknowledged numbers are those below its first stored event, reserved numbers included")
    func acknowledgedNumbersFollowTheEvents() throws {
        let harness = try StoreHarness()
        try harness.apply([
            Sample.device("alice", "phone"),
            .reserveSequence(user: "alice", device: "phone", through: 64),
        ] + (1...3).map { Sample.append("alice", "phone", $0) })
        try harness.apply([.acknowledge(user: "alice", device: "phone", through: 2)])
        try harness.reopen()
        var device = try #require(try harness.verify().devices.first)
        #expect(device.events.map(\.seq) == [3] && device.ackedSeq == 2 && device.lastSeq == 64)
        try harness.apply([.acknowledge(user: "alice", device: "phone", through: 3)])
        try harness.reopen()
        device = try #require(try harness.verify().devices.first)
        // 4...64 were reserved and never used: nothing is pending below the next number.
        #expect(device.events.isEmpty && device.ackedSeq == 64 && device.lastSeq == 64)
    }

    @Test("an acknowledgement of reserved numbers with nothing stored writes no page")
    func acknowledgementWithinTheReservationWritesNothing() throws {
        let harness = try StoreHarness()
        try harness.apply([
            Sample.device("alice", "phone"),
            .reserveSequence(user: "alice", device: "phone", through: 64),
        ])
        let wal = harness.store.configuration.databasePath + "-wal"
        func walSize() throws -> Int { (try FileManager.default.attributesOfItem(atPath: wal)[.size] as? NSNumber)?.intValue ?? 0 }
        let before = try walSize()
        // What a message to an idle device leaves after compaction (its event and the
        // acknowledgement cancelled out): the device's row stays as it is.
        try harness.apply([.acknowledge(user: "alice", device: "phone", through: 1)])
        #expect(try walSize() == before, "the acknowledgement's commit wrote pages to the WAL")
        // Beyond the reservation it does raise lastSeq, so no number is handed out twice.
        try harness.apply([.acknowledge(user: "alice", device: "phone", through: 70)])
        #expect(try walSize() > before)
        try harness.reopen()
        let device = try #require(try harness.verify().devices.first)
        #expect(device.lastSeq == 70 && device.ackedSeq == 70)
    }

    @Test("acknowledging everything leaves the device with its counters and no events")
    func acknowledgeAll() throws {
        let harness = try StoreHarness()
        try harness.apply([Sample.device("alice", "phone")] + (1...3).map { Sample.append("alice", "phone", $0) }
            + [.acknowledge(user: "alice", device: "phone", through: 3)])
        try harness.reopen()
        let device = try #require(try harness.verify().devices.first)
        #expect(device.events.isEmpty)
        #expect(device.ackedSeq == 3 && device.lastSeq == 3)
    }

    @Test("removeDevice deletes the device and its events, and nothing of other devices")
    func removeDevice() throws {
        let harness = try StoreHarness()
        try harness.apply([
            Sample.device("alice", "phone"), Sample.device("alice", "tablet"),
            Sample.append("alice", "phone", 1), Sample.append("alice", "tablet", 1),
            .registerPush(user: "alice", device: "phone", registration: PushRegistration(platform: "fcm", token: [9])),
        ])
        try harness.apply([.removeDevice(user: "alice", device: "phone")])
        try harness.verify()
        try harness.reopen()
        let snapshot = try harness.verify()
        #expect(snapshot.devices.map(\.deviceID) == ["tablet"])
        #expect(snapshot.devices.first?.events.map(\.seq) == [1])
        // Gone for good: a device of the same name starts afresh.
        try harness.apply([Sample.device("alice", "phone", session: 7)])
        let again = try #require(try harness.verify().devices.first { $0.deviceID == "phone" })
        #expect(again.events.isEmpty && again.lastSeq == 0 && again.pushRegistrations.isEmpty)
    }

    @Test("holdForUser keeps events per user in ordinal order; releaseHeld deletes up to an ordinal")
    func heldEvents() throws {
        let harness = try StoreHarness()
        try harness.apply([
            .holdForUser(user: "carol", event: Sample.event(2)),
            .holdForUser(user: "carol", event: Sample.event(1, receipt: StoredReceipt(sender: "bob", messageID: "x", recipient: "carol"))),
            .holdForUser(user: "dave", event: Sample.event(1)),
        ])
        try harness.verify()
        try harness.apply([.holdForUser(user: "carol", event: Sample.event(3)), .releaseHeld(user: "carol", through: 2)])
        try harness.apply([.releaseHeld(user: "dave", through: 1)])
        try harness.reopen()
        let snapshot = try harness.verify()
        #expect(snapshot.held.keys.sorted() == ["carol"])
        #expect(snapshot.held["carol"]?.map(\.seq) == [3])
    }

    @Test("withdrawEvent and withdrawHeld delete one event each, and nothing when it is gone; withdrawEvent raises lastSeq")
    func withdrawals() throws {
        let harness = try StoreHarness()
        try harness.apply([
            Sample.device("bob", "phone"),
            Sample.append("bob", "phone", 1), Sample.append("bob", "phone", 2), Sample.append("bob", "phone", 3),
            .holdForUser(user: "dave", event: Sample.event(1)), .holdForUser(user: "dave", event: Sample.event(2)),
        ])
        try harness.apply([
            .withdrawEvent(user: "bob", device: "phone", seq: 2),
            .withdrawEvent(user: "bob", device: "phone", seq: 7),  // never stored: only raises lastSeq
            .withdrawEvent(user: "nobody", device: "phone", seq: 1),
            .withdrawHeld(user: "dave", ordinal: 1),
            .withdrawHeld(user: "dave", ordinal: 9),
        ])
        try harness.reopen()
        let snapshot = try harness.verify()
        let bob = try #require(snapshot.devices.first)
        #expect(bob.events.map(\.seq) == [1, 3])
        #expect(bob.lastSeq == 7 && bob.ackedSeq == 0)
        #expect(snapshot.held["dave"]?.map(\.seq) == [2])
    }

    @Test("an id remembered again (its record expired) reads back as its latest record; forgetMessageID deletes the record of its server time")
    func messageIDs() throws {
        let harness = try StoreHarness()
        try harness.apply([
            .rememberMessageID(StoredMessageID(sender: "bob", messageID: "m1", serverTime: 10, expiresAt: 20)),
            .rememberMessageID(StoredMessageID(sender: "bob", messageID: "m2", serverTime: 11, expiresAt: 21)),
            .rememberMessageID(StoredMessageID(sender: "amy", messageID: "m1", serverTime: 12, expiresAt: 22)),
            .rememberMessageID(StoredMessageID(sender: "amy", messageID: "m2", serverTime: 13, expiresAt: 23)),
        ])
        try harness.apply([
            .rememberMessageID(StoredMessageID(sender: "bob", messageID: "m1", serverTime: 30, expiresAt: 40)),
            .forgetMessageID(sender: "bob", messageID: "m2", serverTime: 11),
            .forgetMessageID(sender: "amy", messageID: "m2", serverTime: 99),  // not that record: it stays
            .forgetMessageID(sender: "nobody", messageID: "never-stored", serverTime: 1),
        ])
        try harness.reopen()
        let snapshot = try harness.verify()
        #expect(snapshot.messageIDs == [
            StoredMessageID(sender: "amy", messageID: "m1", serverTime: 12, expiresAt: 22),
            StoredMessageID(sender: "amy", messageID: "m2", serverTime: 13, expiresAt: 23),
            StoredMessageID(sender: "bob", messageID: "m1", serverTime: 30, expiresAt: 40),
        ])
    }

    @Test("registerPush keeps one token per kind: a new one replaces only the device's token of the same kind")
    func registerPush() throws {
        let harness = try StoreHarness()
        try harness.apply([
            Sample.device("alice", "phone"),
            .registerPush(user: "alice", device: "phone", registration: PushRegistration(platform: "apns", token: [1])),
            .registerPush(user: "alice", device: "phone", registration: PushRegistration(
                platform: "apns-voip", token: [2], environment: "sandbox", topic: "com.example.app")),
            .registerPush(user: "alice", device: "phone", registration: PushRegistration(platform: "relay-x", token: [3])),
        ])
        let token = [UInt8](repeating: 0xAB, count: ProtocolLimits.maxTokenBytes)
        try harness.apply([
            .registerPush(user: "alice", device: "phone", registration: PushRegistration(platform: "fcm", token: token)),
            .registerPush(user: "alice", device: "phone", registration: PushRegistration(platform: "apns", token: [4], environment: "sandbox")),
        ])
        try harness.reopen()
        let device = try #require(try harness.verify().devices.first)
        #expect(device.pushRegistrations == [
            PushRegistration(platform: "apns-voip", token: [2], environment: "sandbox", topic: "com.example.app"),
            PushRegistration(platform: "apns", token: [4], environment: "sandbox"),
            PushRegistration(platform: "fcm", token: token),
            PushRegistration(platform: "relay-x", token: [3]),
        ])
    }

    @Test("removePush deletes the device's token of one kind and leaves the others")
    func removePush() throws {
        let harness = try StoreHarness()
        try harness.apply([
            Sample.device("alice", "phone"),
            .registerPush(user: "alice", device: "phone", registration: PushRegistration(platform: "apns", token: [1])),
            .registerPush(user: "alice", device: "phone", registration: PushRegistration(platform: "apns-voip", token: [2])),
        ])
        try harness.apply([
            .removePush(user: "alice", device: "phone", kind: .apnsVoIP),
            .removePush(user: "alice", device: "phone", kind: .fcm),  // none: nothing happens
        ])
        try harness.reopen()
        let device = try #require(try harness.verify().devices.first)
        #expect(device.pushRegistrations == [PushRegistration(platform: "apns", token: [1])])
    }

    @Test("edge values round-trip: empty and 64 KiB bodies, empty and non-ASCII ids, extreme numbers")
    func edgeValues() throws {
        let harness = try StoreHarness()
        let big = Sample.bigEvent, empty = Sample.emptyEvent
        try harness.apply(Sample.edgeValues)
        try harness.verify()
        try harness.reopen()
        let snapshot = try harness.verify()
        let zoe = try #require(snapshot.devices.first { $0.userID == "zoë 👋" })
        #expect(zoe.events == [big, empty])
        #expect(zoe.lastSeq == UInt64(Int64.max))
        #expect(zoe.pushRegistrations == [PushRegistration(platform: "", token: [])])
        #expect(snapshot.devices.contains { $0.userID == "nul\u{0}inside" })
    }

    @Test("an empty batch changes nothing")
    func emptyBatch() throws {
        let harness = try StoreHarness()
        try harness.apply([Sample.device("alice", "phone")])
        try harness.apply([])
        #expect(try harness.verify().devices.count == 1)
    }
}
