import SQLiteStoreFixtures
import SignalingStore
import Testing
@testable import SignalingStoreSQLite

@Suite("SQLite store: message ids write the ends of their table")
struct MessageIDPagesTests {
    /// Random 32-digit hex ids, as apps send (UUIDs), from a fixed seed.
    struct IDs {
        var state: UInt64 = 0x9E37_79B9_7F4A_7C15

        mutating func next() -> String {
            var digits = ""
            for _ in 0..<2 {
                // SplitMix64: any well-spread sequence will do.
                state &+= 0x9E37_79B9_7F4A_7C15
                var z = state
                z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
                z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
                let hex = String(z ^ (z >> 31), radix: 16)
                digits += String(repeating: "0", count: 16 - hex.count) + hex
            }
            return digits
        }
    }

    @Test("remembering random ids and forgetting the oldest writes a few pages a commit, not one per id")
    func randomIDsTouchFewPages() throws {
        let harness = try StoreHarness()
        var ids = IDs()
        // 20,000 ids kept (about 300 leaf pages), accepted one millisecond apart.
        var retained: [StoredMessageID] = []
        var time: UInt64 = 1_800_000_000_000
        func remembered() -> StoredMessageID {
            time += 1
            return StoredMessageID(sender: "sender", messageID: ids.next(), serverTime: time, expiresAt: time + 86_400_000)
        }
        for _ in 0..<10 {
            let batch = (0..<2_000).map { _ in remembered() }
            retained += batch
            try harness.apply(batch.map { .rememberMessageID($0) })
        }
        // Then commits as the server's writer makes them once --dedup-capacity is reached:
        // each new id remembered, the oldest forgotten. Keyed by (sender, id), each of the 20
        // ids and each of the 20 forgotten ones was on a page of its own (about 40 a commit).
        let before = harness.store.pagesWritten
        let commits = 20
        for commit in 0..<commits {
            var batch: [StoreChange] = []
            for index in 0..<20 {
                let oldest = retained[commit * 20 + index]
                let new = remembered()
                batch += [.rememberMessageID(new), .forgetMessageID(sender: oldest.sender, messageID: oldest.messageID, serverTime: oldest.serverTime)]
                retained.append(new)
            }
            try harness.apply(batch)
        }
        let perCommit = Double(harness.store.pagesWritten - before) / Double(commits)
        #expect(perCommit <= 8, "\(perCommit) pages written per commit")
        // And nothing is lost or kept too long.
        try harness.reopen()
        let snapshot = try harness.verify()
        #expect(snapshot.messageIDs.count == 20_000)
    }
}
