import SQLiteStoreFixtures
import Foundation
import SignalingStore
import SignalingStoreSQLite
import Testing

/// A real full disk (a small tmpfs), not the page cap: SQLite sees ENOSPC.
@Suite("SQLite store: a full disk", .enabled(if: ScratchFileSystem.isAvailable, "needs permission to mount a tmpfs"))
struct DiskFullTests {
    @Test("a batch that meets a full disk fails with .full and leaves nothing; after the disk is cleaned it goes through")
    func fullDiskThenCleaned() throws {
        let disk = try ScratchFileSystem(sizeBytes: 3 * 1024 * 1024)
        defer { disk.unmount() }
        // Ballast: what an operator would delete to make room.
        let ballast = disk.path + "/ballast"
        #expect(FileManager.default.createFile(atPath: ballast, contents: Data(count: 1024 * 1024)))
        let harness = try StoreHarness(dataDirectory: disk.path + "/data")
        try harness.apply([Sample.device("alice", "phone")])

        var seq: UInt64 = 0
        var refused: (batch: [StoreChange], error: StoreError)?
        while refused == nil && seq < 10_000 {
            let batch = (seq + 1...seq + 20).map { Sample.append("alice", "phone", $0, bodySize: 4_000) }
            do {
                try harness.apply(batch)
                seq += 20
            } catch {
                refused = (batch, error)
            }
        }
        let (batch, error) = try #require(refused)
        #expect(error.kind == .full, "\(error)")
        #expect(error.message.contains("full") || error.message.contains("No space"), "\(error)")
        try harness.verify()

        #expect(unlink(ballast) == 0)
        try harness.apply(batch)
        try harness.verify()
        try harness.reopen()
        #expect(try harness.verify().devices.first?.events.count == Int(seq) + 20)
    }
}
