import SQLiteStoreFixtures
import SignalingProtocol
import SignalingStore
import SignalingStoreSQLite
import Testing

@Suite("SQLite store: large snapshots")
struct LargeSnapshotTests {
    @Test("1,000 devices with 10 events each, held events and message ids load completely and in order")
    func thousandDevices() throws {
        let harness = try StoreHarness()
        var batch: [StoreChange] = []
        for user in 0..<250 {
            for device in 0..<4 {
                batch.append(Sample.device("user\(user)", "device\(device)", session: UInt64(user * 4 + device)))
                // Appended newest first: the snapshot must still be in seq order.
                for seq in (1...10).reversed() {
                    batch.append(Sample.append("user\(user)", "device\(device)", UInt64(seq), bodySize: 100 + seq))
                }
            }
            batch.append(.acknowledge(user: "user\(user)", device: "device0", through: 2))
        }
        for user in 0..<100 {
            for ordinal in 1...5 { batch.append(.holdForUser(user: "waiting\(user)", event: Sample.event(UInt64(ordinal)))) }
        }
        for id in 0..<1_000 {
            batch.append(.rememberMessageID(StoredMessageID(sender: "sender\(id % 10)", messageID: "m\(id)", serverTime: UInt64(id), expiresAt: UInt64(id) + 86_400_000)))
        }
        try harness.apply(batch)
        try harness.reopen()
        let snapshot = try harness.verify()
        #expect(snapshot.devices.count == 1_000)
        #expect(snapshot.devices.reduce(0) { $0 + $1.events.count } == 1_000 * 10 - 250 * 2)
        #expect(snapshot.devices.allSatisfy { $0.events.map(\.seq) == Array(($0.ackedSeq + 1)...10) })
        #expect(snapshot.held.count == 100 && snapshot.held.values.allSatisfy { $0.map(\.seq) == [1, 2, 3, 4, 5] })
        #expect(snapshot.messageIDs.count == 1_000)
    }
}
