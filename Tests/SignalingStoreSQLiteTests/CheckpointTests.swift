import SQLiteStoreFixtures
import Foundation
import SignalingStore
import Testing
@testable import SignalingStoreSQLite

@Suite("SQLite store: background checkpoints")
struct CheckpointTests {
    @Test("the WAL is checkpointed off the commit path and stays bounded; nothing is lost")
    func walStaysBounded() throws {
        let harness = try StoreHarness()
        try harness.apply([Sample.device("alice", "phone")])
        // About 12 MB of events in small batches: well past the 1,000-page threshold.
        var seq: UInt64 = 0
        for _ in 0..<300 {
            let batch = (0..<10).map { _ -> StoreChange in
                seq += 1
                return Sample.append("alice", "phone", seq, bodySize: 4_000)
            }
            try harness.apply(batch)
            // Keep the store from growing: acknowledge all but the last batch.
            if seq > 10 { try harness.apply([.acknowledge(user: "alice", device: "phone", through: seq - 10)]) }
        }
        let wal = harness.store.configuration.databasePath + "-wal"
        func walSize() throws -> Int { (try FileManager.default.attributesOfItem(atPath: wal)[.size] as? NSNumber)?.intValue ?? 0 }
        // The checkpointer has its own thread and, on a loaded machine, may trail the
        // writes: wait (bounded) for a checkpoint, with a small commit now and then, which
        // is what restarts the WAL (and truncates it to journal_size_limit) after one.
        let deadline = Date().addingTimeInterval(20)
        var size = try walSize()
        while harness.store.checkpointsRun == 0 || size >= 10 << 20, Date() < deadline {
            try harness.apply([.acknowledge(user: "alice", device: "phone", through: seq - 10)])
            usleep(1_000)
            size = try walSize()
        }
        #expect(harness.store.checkpointsRun > 0, "no checkpoint ran")
        // A checkpoint that copies nothing still counts: what shows that one worked is a
        // WAL that restarted (about 12 MB went through it) and pages in the database file.
        #expect(size < 10 << 20, "the WAL grew to \(size) bytes")
        let file = (try FileManager.default.attributesOfItem(atPath: harness.store.configuration.databasePath)[.size] as? NSNumber)?.intValue ?? 0
        #expect(file > 64 << 10, "the database file holds \(file) bytes: nothing was checkpointed into it")
        try harness.verify()
    }
}
