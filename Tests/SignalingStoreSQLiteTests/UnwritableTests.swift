import SQLiteStoreFixtures
import Foundation
import SignalingStore
import SignalingStoreSQLite
import SignalingSupport
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// A data directory or file this process may not write gives `.readOnly`, never a crash.
/// Root ignores permission bits, so the store is driven by the helper, which gives up root
/// for the unprivileged "nobody" first.
@Suite("SQLite store: unwritable directory or file")
struct UnwritableTests {
    /// Runs `open-and-apply` on `data` inside `directory`; returns its output lines.
    private func openAndApply(_ directory: TemporaryDirectory) throws -> [String] {
        // The unprivileged child must be able to reach the data directory.
        chmod(directory.path, 0o755)
        let run = try ExecutableRun.run("sqlite-store-test-helper", ["open-and-apply", directory.file("data")], timeoutSeconds: 30)
        try #require(run.exitCode == 0, "helper failed: \(run.stderr)")
        return run.stdout.split(separator: "\n").map(String.init)
    }

    /// A store with one device, closed, in `data`, owned by whoever runs the test.
    private func makeStore(in directory: TemporaryDirectory) throws -> SQLiteStoreConfiguration {
        let configuration = SQLiteStoreConfiguration(directory: directory.file("data"))
        let store = try SQLiteEventStore(configuration: configuration)
        try store.apply([Sample.device("alice", "phone")])
        store.close()
        return configuration
    }

    @Test("a read-only directory without a store: opening fails with readOnly")
    func readOnlyEmptyDirectory() throws {
        let directory = try TemporaryDirectory()
        #expect(mkdir(directory.file("data"), 0o555) == 0)
        let lines = try openAndApply(directory)
        #expect(lines.count == 1 && lines.first?.hasPrefix("error readOnly ") == true, "\(lines)")
        #expect(lines.first?.contains("Permission denied") == true, "\(lines)")
    }

    @Test("a store in a directory that became read-only: opening fails with readOnly")
    func readOnlyDirectoryWithStore() throws {
        let directory = try TemporaryDirectory()
        let configuration = try makeStore(in: directory)
        // The files stay writable; the directory, where SQLite creates -wal and -shm, is not.
        for name in try FileManager.default.contentsOfDirectory(atPath: configuration.directory) {
            chmod(configuration.directory + "/" + name, 0o666)
        }
        chmod(configuration.directory, 0o555)
        let lines = try openAndApply(directory)
        #expect(lines.count == 1 && lines.first?.hasPrefix("error readOnly ") == true, "\(lines)")
    }

    @Test("a read-only database file in a writable directory: opening fails with readOnly")
    func readOnlyFile() throws {
        let directory = try TemporaryDirectory()
        let configuration = try makeStore(in: directory)
        chmod(configuration.directory, 0o777)
        chmod(configuration.lockPath, 0o666)
        chmod(configuration.databasePath, 0o444)
        let lines = try openAndApply(directory)
        #expect(lines.count == 1 && lines.first?.hasPrefix("error readOnly ") == true, "\(lines)")
        #expect(lines.first?.contains("not writable") == true, "\(lines)")
    }

    @Test("the same store, writable again, opens and applies")
    func writableControl() throws {
        let directory = try TemporaryDirectory()
        let configuration = try makeStore(in: directory)
        chmod(configuration.directory, 0o777)
        for name in try FileManager.default.contentsOfDirectory(atPath: configuration.directory) {
            chmod(configuration.directory + "/" + name, 0o666)
        }
        let lines = try openAndApply(directory)
        #expect(lines == ["opened", "applied"])
    }
}
