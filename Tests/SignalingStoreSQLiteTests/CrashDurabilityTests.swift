import SQLiteStoreFixtures
import SignalingStore
import SignalingStoreSQLite
import SignalingSupport
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// kill -9 in the middle of a stream of batches: every batch the child reported as
/// committed is there after reopening, and no batch is there in part.
@Suite("SQLite store: committed batches survive kill -9")
struct CrashDurabilityTests {
    /// Batches each round lets the child report before killing it.
    static let batchesBeforeKill = 150
    static let rounds = 3

    @Test("a child killed mid-stream loses no committed batch and leaves no partial one",
          arguments: SQLiteStoreConfiguration.Synchronous.allCases)
    func killMidStream(synchronous: SQLiteStoreConfiguration.Synchronous) throws {
        let directory = try TemporaryDirectory()
        let dataDirectory = directory.file("data")
        // The model of the store after `modelBatch`; batches are deterministic.
        var model = ReferenceStore()
        var modelBatch = -1
        var next = 0

        for round in 1...Self.rounds {
            let child = try ChildProcess.spawn(
                ExecutableRun.path(of: "sqlite-store-test-helper"),
                arguments: ["commit-batches", dataDirectory, synchronous.rawValue, String(next)],
                pipeInput: false, stdout: .pipe, stderr: .inherit)
            let output = ChildOutput(descriptor: child.output)
            let enough = output.read(until: { $0.count >= Self.batchesBeforeKill }, timeoutSeconds: 60)
            child.send(signal: SIGKILL)
            let status = try #require(child.waitForExit(timeoutSeconds: 10), "the child did not die")
            #expect(output.readToEnd(timeoutSeconds: 10))
            try #require(enough, "round \(round): the child reported \(output.lines.count) batches: \(output.lines.suffix(3))")
            #expect(ChildProcess.describe(status: status) == "killed by signal 9", "round \(round)")

            // Every line is "committed N", N counting up from `next`.
            let committed = output.lines.compactMap { line -> Int? in
                line.hasPrefix("committed ") ? Int(line.dropFirst("committed ".count)) : nil
            }
            try #require(committed.count == output.lines.count, "unexpected output: \(output.lines.suffix(3))")
            try #require(committed == Array(next..<next + committed.count))
            let lastReported = committed.last!

            // The store holds exactly the batches up to the last reported one, or one more
            // (committed, killed before it could say so).
            let store = try SQLiteEventStore(configuration: SQLiteStoreConfiguration(directory: dataDirectory))
            defer { store.close() }
            let snapshot = try store.loadSnapshot()
            while modelBatch < lastReported {
                modelBatch += 1
                model.apply(CrashWorkload.batch(modelBatch))
            }
            if snapshot != model.snapshot {
                modelBatch += 1
                model.apply(CrashWorkload.batch(modelBatch))
            }
            #expect(snapshot == model.snapshot,
                    "round \(round): the store matches neither batch \(lastReported) nor \(lastReported + 1)")
            next = modelBatch + 1
        }
    }
}
