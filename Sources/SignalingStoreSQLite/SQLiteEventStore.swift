import CSQLite
import SignalingStore
import SignalingSupport

/// The default `EventStore`: one SQLite database in WAL mode in the server's data
/// directory.
///
/// Confinement: like every `EventStore`, it is used by one thread at a time: the server
/// loads the snapshot before it starts, then calls `apply` from its single store-writer
/// thread only, and `close` after that thread has stopped. The class holds a SQLite
/// connection (opened without SQLite's own mutex) and cached statements, none of which
/// may be used concurrently; that rule, not a lock, is what makes `@unchecked Sendable`
/// sound. Moving the store between threads is fine as long as calls never overlap.
public final class SQLiteEventStore: EventStore, EventBodySource, @unchecked Sendable {
    public let configuration: SQLiteStoreConfiguration
    private let logger: Logger

    /// The connection and its statements while the store is open; nil once closed.
    private struct OpenDatabase {
        let connection: SQLiteConnection
        let writer: ChangeWriter
        let checkpointer: WALCheckpointer
        /// Bodies for the server to write (`EventBodySource`), on the writer's connection.
        let selectBodies: SQLiteStatement
    }
    private var database: OpenDatabase?
    /// Released after the database is closed, so the next owner finds it checkpointed.
    private var lock: DataDirectoryLock?
    /// The WAL checkpointer's thread (`vs-checkpoint`), for the server to place beside
    /// its store writer. A constant, so any thread may read it.
    public let backgroundThreads: [JoinableThread]

    /// Opens (creating if needed) the store in `configuration.directory`. Throws
    /// `.readOnly` when the directory or file cannot be written, `.corrupt` for a file
    /// that is not ours or is newer than this build, `.full` when there is no room to
    /// create it, and `.other` when another process has the directory open.
    public init(configuration: SQLiteStoreConfiguration, logger: Logger = .silent) throws(StoreError) {
        self.configuration = configuration
        self.logger = logger
        try configuration.validate()
        try DataDirectory.create(configuration.directory)
        let lock = try DataDirectoryLock(path: configuration.lockPath)
        let connection: SQLiteConnection
        let foundVersion: Int64
        let writer: ChangeWriter
        let checkpointer: WALCheckpointer
        let selectBodies: SQLiteStatement
        do throws(StoreError) {
            connection = try SQLiteConnection.open(path: configuration.databasePath)
            let cap = try Self.configure(connection, configuration)
            if let cap, cap != configuration.maxPageCount.map(Int64.init) {
                // SQLite never sets the cap below the file's current size.
                logger.warning("store_cap_below_size", ["path": configuration.databasePath,
                    "max_page_count": configuration.maxPageCount ?? 0, "effective": cap])
            }
            foundVersion = try SQLiteSchema.prepare(connection)
            writer = try ChangeWriter(connection: connection)
            selectBodies = try connection.prepare("""
                SELECT seq, body FROM device_events
                WHERE user_id = ?1 AND device_id = ?2 AND seq >= ?3 ORDER BY seq LIMIT ?4
                """, as: "select bodies")
            checkpointer = try WALCheckpointer(path: configuration.databasePath, logger: logger)
        } catch {
            // Every failure here is about the database file: name it.
            throw StoreError(error.kind, "\(configuration.databasePath): \(error.message)")
        }
        checkpointer.watch(connection)
        backgroundThreads = checkpointer.thread.map { [$0] } ?? []
        database = OpenDatabase(connection: connection, writer: writer, checkpointer: checkpointer, selectBodies: selectBodies)
        self.lock = lock
        logger.info("store_opened", [
            "path": configuration.databasePath,
            "synchronous": configuration.synchronous.rawValue,
            "schema": foundVersion == 0 ? "created v\(SQLiteSchema.currentVersion)"
                : foundVersion == SQLiteSchema.currentVersion ? "v\(foundVersion)"
                : "upgraded v\(foundVersion) to v\(SQLiteSchema.currentVersion)",
            "max_page_count": configuration.maxPageCount.map(String.init) ?? "none",
        ])
    }

    deinit {
        close()
    }

    /// Checkpoints the background checkpointer has run (for tests and monitoring).
    var checkpointsRun: Int { database?.checkpointer.checkpoints.load(ordering: .relaxed) ?? 0 }

    /// Pages the commits have written to the WAL so far (SQLite's
    /// SQLITE_DBSTATUS_CACHE_WRITE), 4 KiB each: what the commits cost the disk, before the
    /// checkpoints copy them on (Tools/store-bench). Read on the thread that applies, or
    /// while none does (the connection is not shared).
    public var pagesWritten: Int {
        guard let database else { return 0 }
        var current: Int32 = 0, highwater: Int32 = 0
        sqlite3_db_status(database.connection.handle, SQLITE_DBSTATUS_CACHE_WRITE, &current, &highwater, 0)
        return Int(current)
    }

    public func loadSnapshot() throws(StoreError) -> StoredSnapshot {
        guard let database else { throw Self.closedError }
        let snapshot = try SnapshotReader(connection: database.connection, logger: logger).read()
        // The scan filled the page cache with pages the writer will rarely need again.
        sqlite3_db_release_memory(database.connection.handle)
        return snapshot
    }

    public func apply(_ changes: [StoreChange]) throws(StoreError) {
        guard let database else { throw Self.closedError }
        try database.writer.apply(changes)
    }

    public func bodies(user: String, device: String, from seq: UInt64, limit: Int) throws(StoreError) -> [(seq: UInt64, body: [UInt8])] {
        guard let database else { throw Self.closedError }
        let query = database.selectBodies
        defer { query.reset() }
        try query.bind(1, user)
        try query.bind(2, device)
        try query.bind(3, try StoredValue.sequence(seq, "seq"))
        try query.bind(4, Int64(limit))
        var found: [(seq: UInt64, body: [UInt8])] = []
        while try query.step() {
            found.append((UInt64(query.int64(0)), query.blob(1)))
        }
        return found
    }

    /// Closes the database (SQLite checkpoints the WAL into the main file) and releases the
    /// data directory. Calling it again does nothing.
    public func close() {
        guard let database else { return }
        database.checkpointer.unwatch(database.connection)
        database.checkpointer.stop()
        // The statements go with the writer; the connection, which they keep alive,
        // closes with the last of them.
        self.database = nil
        lock = nil
        logger.debug("store_closed", ["path": configuration.databasePath])
    }

    private static let closedError = StoreError(.other, "the store is closed")

    /// Settings SQLite keeps per connection, applied at every open. Returns the size cap in
    /// effect, if one was asked for.
    private static func configure(_ connection: SQLiteConnection, _ configuration: SQLiteStoreConfiguration) throws(StoreError) -> Int64? {
        try connection.setBusyTimeout(milliseconds: Int32(configuration.busyTimeoutMilliseconds))
        // WAL: readers (a backup) never block the writer, and a commit appends to one file.
        let mode = try connection.text("PRAGMA journal_mode = WAL")
        guard mode.lowercased() == "wal" else {
            throw StoreError(.other, "the file system does not support WAL mode (journal_mode is \(mode))")
        }
        switch configuration.synchronous {
        case .normal: try connection.execute("PRAGMA synchronous = NORMAL")
        case .full: try connection.execute("PRAGMA synchronous = FULL")
        }
        try connection.execute("PRAGMA foreign_keys = ON")
        // Checkpoints run on their own thread (WALCheckpointer), never inside a commit.
        try connection.execute("PRAGMA wal_autocheckpoint = 0")
        // A 256 KiB page cache (SQLite's default is 2 MiB). The writer mostly touches the
        // pages it just wrote; the OS page cache serves the rest. Measured with voipload,
        // fan-out throughput is the same as with 1 MiB, and every byte here counts against
        // the server's memory per idle connection.
        try connection.execute("PRAGMA cache_size = -256")
        // After a checkpoint a WAL larger than this is truncated back, so one very large
        // batch does not keep its disk space for ever.
        try connection.execute("PRAGMA journal_size_limit = \(walSizeLimitBytes)")
        guard let pages = configuration.maxPageCount else { return nil }
        return try connection.integer("PRAGMA max_page_count = \(pages)")
    }

    /// 64 MiB.
    static let walSizeLimitBytes = 64 * 1024 * 1024
}
