import SQLiteStoreFixtures
import SignalingProtocol
import SignalingStore
import SignalingStoreSQLite
import Testing

/// A batch is all or nothing: whatever makes it fail midway (the size cap, bad input), none
/// of it is visible afterwards and the store takes the next batch.
@Suite("SQLite store: batches are atomic")
struct AtomicityTests {
    /// A batch of every kind of change ending in large events, so that the cap is hit after
    /// the small changes have been written.
    private func mixedBatch(appendingFrom seq: UInt64, count: UInt64) -> [StoreChange] {
        [
            .rememberMessageID(StoredMessageID(sender: "bob", messageID: "new", serverTime: 1, expiresAt: 2)),
            .registerPush(user: "bob", device: "phone", registration: PushRegistration(platform: "apns", token: [7])),
            .holdForUser(user: "carol", event: Sample.event(1)),
            .acknowledge(user: "bob", device: "phone", through: 1),
            Sample.device("alice", "phone", session: 99),
        ] + (seq..<seq + count).map { Sample.append("alice", "phone", $0, bodySize: 2_000) }
    }

    @Test("a batch that hits the size cap leaves nothing behind; after acknowledgements free space it goes through")
    func fullThenFreed() throws {
        let harness = try StoreHarness(maxPageCount: 48)
        try harness.apply([Sample.device("alice", "phone"), Sample.device("bob", "phone"), Sample.append("bob", "phone", 1)])

        // Fill the store one event per batch until the cap refuses one.
        var lastSeq: UInt64 = 0
        var refusal: StoreError?
        while refusal == nil && lastSeq < 1_000 {
            do {
                try harness.apply([Sample.append("alice", "phone", lastSeq + 1, bodySize: 2_000)])
                lastSeq += 1
            } catch {
                refusal = error
            }
        }
        #expect(refusal?.kind == .full)
        #expect(lastSeq > 10, "the cap leaves room for some events")
        try harness.verify()

        let batch = mixedBatch(appendingFrom: lastSeq + 1, count: 20)
        let error = harness.applyFailing(batch)
        #expect(error?.kind == .full)
        #expect(error?.message.contains("full") == true, "\(String(describing: error))")
        try harness.verify()  // none of the batch, in particular not its first changes

        // The device acknowledges what it has; the freed pages are reused.
        try harness.apply([.acknowledge(user: "alice", device: "phone", through: lastSeq)])
        try harness.apply(batch)
        try harness.verify()
        try harness.reopen()
        let snapshot = try harness.verify()
        #expect(snapshot.devices.first { $0.userID == "alice" }?.events.count == 20)
    }

    @Test("a batch refused by the size cap goes through after reopening with a larger cap")
    func fullThenCapRaised() throws {
        let harness = try StoreHarness(maxPageCount: 16)
        try harness.apply([Sample.device("alice", "phone"), Sample.device("bob", "phone")])
        let batch = mixedBatch(appendingFrom: 1, count: 100)
        #expect(harness.applyFailing(batch)?.kind == .full)
        try harness.verify()
        // The same open store keeps working for batches that fit.
        try harness.apply([Sample.append("bob", "phone", 1)])

        try harness.reopen(maxPageCount: nil)
        try harness.apply(batch)
        try harness.reopen()
        #expect(try harness.verify().devices.first { $0.userID == "alice" }?.events.count == 100)
    }

    static let invalidChanges: [(name: String, change: StoreChange)] = [
        ("a seq the device already has", Sample.append("alice", "phone", 1)),
        ("an event for a device never stored", Sample.append("nobody", "phone", 1)),
        ("a push registration for a device never stored",
         .registerPush(user: "nobody", device: "phone", registration: PushRegistration(platform: "apns", token: [1]))),
        ("a seq beyond 2^63 - 1", Sample.append("alice", "phone", UInt64(Int64.max) + 1)),
        ("an acknowledgement beyond 2^63 - 1", .acknowledge(user: "alice", device: "phone", through: .max)),
        ("an ordinal held twice", .holdForUser(user: "carol", event: Sample.event(1))),
    ]

    @Test("an invalid change midway rolls back the whole batch with a clear error",
          arguments: invalidChanges.indices)
    func invalidChangeRollsBack(index: Int) throws {
        let (name, invalid) = Self.invalidChanges[index]
        let harness = try StoreHarness()
        try harness.apply([
            Sample.device("alice", "phone"), Sample.append("alice", "phone", 1),
            .holdForUser(user: "carol", event: Sample.event(1)),
        ])
        let batch: [StoreChange] = [
            Sample.append("alice", "phone", 2),
            .rememberMessageID(StoredMessageID(sender: "bob", messageID: "m", serverTime: 1, expiresAt: 2)),
            invalid,
            Sample.append("alice", "phone", 3),
        ]
        let error = harness.applyFailing(batch)
        #expect(error?.kind == .other, "\(name)")
        #expect(error?.message.hasPrefix("change 3 of 4") == true, "\(name): \(String(describing: error))")
        if case .appendEvent(user: "nobody", _, _) = invalid {
            #expect(error?.message.contains("no such device") == true, "\(String(describing: error))")
        }
        try harness.verify()
        // The connection is ready for the next batch.
        try harness.apply([Sample.append("alice", "phone", 2)])
        try harness.verify()
    }

    @Test("a closed store refuses calls with an error; closing twice is harmless")
    func closed() throws {
        let harness = try StoreHarness()
        harness.store.close()
        harness.store.close()
        let applyError = #expect(throws: StoreError.self) { try harness.store.apply([Sample.device("a", "b")]) }
        #expect(applyError?.message.contains("closed") == true)
        #expect(throws: StoreError.self) { try harness.store.loadSnapshot() }
    }
}
