import SignalingStore

/// How the SQLite store opens its database. The defaults suit the server: the file in the
/// data directory, crash-safe commits, no size cap.
public struct SQLiteStoreConfiguration: Sendable, Equatable {
    /// When a commit is on disk. In WAL mode both settings keep the database consistent;
    /// they differ in which commits a failure may take back.
    public enum Synchronous: String, Sendable, Equatable, CaseIterable {
        /// A committed batch survives a crash of the process (including kill -9): it is in
        /// the WAL file, written but not yet fsynced. A power loss or kernel crash may lose
        /// the batches committed since the WAL was last synced (SQLite syncs it at each
        /// checkpoint, about every 4 MB of changes), but never corrupts the database.
        case normal
        /// Every commit fsyncs the WAL: a committed batch also survives a power loss.
        /// Costs one fsync per `apply`, which group commit amortises over the batch.
        case full
    }

    /// The name of the database file inside `directory`. Its WAL (`-wal`) and shared
    /// memory (`-shm`) files, and the lock file, live beside it.
    public static let databaseFileName = "voipserver.sqlite"
    /// Held (flock) by the process that has the store open, so that a second server on the
    /// same data directory is refused instead of interleaving its writes with ours.
    public static let lockFileName = "voipserver.lock"

    /// The data directory (`--data-dir`). Created, with its parents, if missing.
    public var directory: String
    public var synchronous: Synchronous
    /// A cap on the database file, in pages (`PRAGMA max_page_count`; a page is 4 KiB
    /// unless the file was created otherwise). A batch that would grow the file beyond it
    /// fails with `StoreError.Kind.full`. Nil: no cap besides the disk.
    public var maxPageCount: Int?
    /// How long a write waits for a lock held by another connection (a backup, the sqlite3
    /// shell) before failing, in milliseconds.
    public var busyTimeoutMilliseconds: Int

    public init(
        directory: String, synchronous: Synchronous = .normal, maxPageCount: Int? = nil,
        busyTimeoutMilliseconds: Int = 5_000
    ) {
        self.directory = directory
        self.synchronous = synchronous
        self.maxPageCount = maxPageCount
        self.busyTimeoutMilliseconds = busyTimeoutMilliseconds
    }

    /// The database file's path.
    public var databasePath: String { Self.join(directory, Self.databaseFileName) }
    /// The lock file's path.
    public var lockPath: String { Self.join(directory, Self.lockFileName) }

    /// Refuses settings SQLite would misread, before anything is created.
    func validate() throws(StoreError) {
        if directory.isEmpty { throw StoreError(.other, "the data directory path is empty") }
        if let maxPageCount, maxPageCount < 1 || maxPageCount > Int(UInt32.max) {
            throw StoreError(.other, "maxPageCount must be between 1 and \(UInt32.max), got \(maxPageCount)")
        }
        if busyTimeoutMilliseconds < 0 || busyTimeoutMilliseconds > Int(Int32.max) {
            throw StoreError(.other, "the busy timeout must be between 0 and \(Int32.max) ms, got \(busyTimeoutMilliseconds)")
        }
    }

    static func join(_ directory: String, _ name: String) -> String {
        directory.hasSuffix("/") ? directory + name : directory + "/" + name
    }
}
