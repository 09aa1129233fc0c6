import CLinuxShims
import CSQLite
import SignalingStore
import SignalingSupport
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Copies the write-ahead log into the database file on a thread and connection of its
/// own, so that the store writer's commits never wait behind a checkpoint (and the fsync
/// it does). SQLite's automatic checkpoint, which would run inside whichever commit
/// crossed the threshold, is turned off on the writer's connection.
///
/// The writer's connection reports the WAL's size after every commit (`sqlite3_wal_hook`);
/// past `thresholdPages` the checkpointer is woken and runs a PASSIVE checkpoint, which
/// copies what it can without blocking the writer. SQLite restarts the WAL from its
/// beginning at the next commit after a complete checkpoint, so the file stays small.
///
/// Threading: `walGrew` is called on the writer's thread (inside its commit) and only
/// signals an eventfd; the checkpointer's connection is used by its own thread only.
final class WALCheckpointer: @unchecked Sendable {
    static let thresholdPages: Int32 = 1000

    private let connection: SQLiteConnection
    private let wakeFD: Int32
    private let stopping = Atomic<Bool>(false)
    private let pending = Atomic<Bool>(false)
    /// The checkpointing thread, started by `init`, joined (and cleared) by `stop`.
    private(set) var thread: JoinableThread?
    private let logger: Logger
    /// Checkpoints run so far (for tests).
    let checkpoints = Atomic<Int>(0)

    init(path: String, logger: Logger) throws(StoreError) {
        connection = try SQLiteConnection.open(path: path)
        try connection.setBusyTimeout(milliseconds: 0)
        // A connection learns that the database is in WAL mode, and opens the WAL, only
        // with its first transaction; until then a checkpoint on it does nothing at all
        // (no error either). One read here, so that the first checkpoint is a real one:
        // without it the WAL was never checkpointed while the server ran, and grew by
        // every commit (the database file stayed at its first page, and the WAL index,
        // mapped into the server, grew with it).
        _ = try connection.integer("SELECT count(*) FROM sqlite_master")
        wakeFD = shim_eventfd()
        guard wakeFD >= 0 else { throw StoreError(.other, "cannot create an eventfd for the checkpointer") }
        self.logger = logger
        thread = JoinableThread(name: "vs-checkpoint") { [self] in run() }
    }

    deinit {
        close(wakeFD)
    }

    /// Registers the hook on the writer's connection.
    func watch(_ writer: SQLiteConnection) {
        sqlite3_wal_hook(writer.handle, { context, _, _, pages in
            Unmanaged<WALCheckpointer>.fromOpaque(context!).takeUnretainedValue().walGrew(to: pages)
            return SQLITE_OK
        }, Unmanaged.passUnretained(self).toOpaque())
    }

    /// Removes the hook (before the writer's connection closes or the checkpointer stops).
    func unwatch(_ writer: SQLiteConnection) {
        sqlite3_wal_hook(writer.handle, nil, nil)
    }

    private func walGrew(to pages: Int32) {
        guard pages >= Self.thresholdPages, !pending.exchange(true, ordering: .acquiringAndReleasing) else { return }
        shim_eventfd_signal(wakeFD)
    }

    /// Stops the thread (after a last checkpoint) and closes its connection.
    func stop() {
        guard !stopping.exchange(true, ordering: .acquiringAndReleasing) else { return }
        shim_eventfd_signal(wakeFD)
        thread?.join()
        thread = nil
    }

    private func run() {
        while true {
            var descriptor = pollfd(fd: wakeFD, events: Int16(POLLIN), revents: 0)
            if poll(&descriptor, 1, -1) > 0 { shim_eventfd_drain(wakeFD) }
            let stop = stopping.load(ordering: .acquiring)
            if pending.exchange(false, ordering: .acquiringAndReleasing) || stop { checkpoint() }
            if stop { return }
        }
    }

    private func checkpoint() {
        var logPages: Int32 = 0
        var copied: Int32 = 0
        let code = sqlite3_wal_checkpoint_v2(connection.handle, nil, SQLITE_CHECKPOINT_PASSIVE, &logPages, &copied)
        checkpoints.add(1, ordering: .relaxed)
        if code != SQLITE_OK && code != SQLITE_BUSY {
            logger.warning("store_checkpoint_failed", ["error": String(cString: sqlite3_errstr(code)), "wal_pages": logPages])
        }
    }
}
