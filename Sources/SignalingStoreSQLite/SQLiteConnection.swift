import CSQLite
import SignalingStore
#if canImport(Glibc)
import Glibc
#endif

/// One open SQLite database handle. Not thread-safe: it is confined to whoever owns the
/// store (see `SQLiteEventStore`), and is opened in SQLite's multi-thread mode (no
/// per-call mutex), which is safe under that confinement.
///
/// Statements keep their connection alive, so the handle is closed only after every
/// statement prepared on it has been finalized.
final class SQLiteConnection {
    let handle: OpaquePointer
    let path: String

    private init(handle: OpaquePointer, path: String) {
        self.handle = handle
        self.path = path
    }

    /// Opens the file read-write, creating it if missing. A file that can only be opened
    /// read-only (permissions) is refused here, not at the first write.
    static func open(path: String) throws(StoreError) -> SQLiteConnection {
        try createPrivately(path)
        var opened: OpaquePointer?
        let flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX
        let code = sqlite3_open_v2(path, &opened, flags, nil)
        guard code == SQLITE_OK, let opened else {
            // On failure SQLite usually still allocates a handle that carries the message.
            let error = opened.map { Self.error(code, handle: $0, context: "open") }
                ?? StoreError(.other, "open: \(String(cString: sqlite3_errstr(code)))")
            sqlite3_close_v2(opened)
            throw error
        }
        let connection = SQLiteConnection(handle: opened, path: path)
        sqlite3_extended_result_codes(opened, 1)
        // SQLite falls back to read-only when the file's permissions deny writing.
        if sqlite3_db_readonly(opened, "main") == 1 {
            throw StoreError(.readOnly, "the database file is not writable by this process")
        }
        return connection
    }

    deinit {
        sqlite3_close_v2(handle)
    }

    /// Creates a missing database file with mode 0600 (it holds users' messages; SQLite
    /// would use 0644). SQLite gives the -wal and -shm files the database file's mode, and
    /// treats an empty file as a new database.
    private static func createPrivately(_ path: String) throws(StoreError) {
        let descriptor = Glibc.open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        if descriptor >= 0 {
            Glibc.close(descriptor)
        } else if errno != EEXIST {
            throw DataDirectory.error("create the database file", errno)
        }
    }

    /// True when no transaction is open.
    var isAutocommit: Bool { sqlite3_get_autocommit(handle) != 0 }

    /// Rows changed by the last INSERT, UPDATE or DELETE.
    var changes: Int32 { sqlite3_changes(handle) }

    /// The extended result code of the last failed call (e.g. SQLITE_CONSTRAINT_FOREIGNKEY).
    var extendedErrorCode: Int32 { sqlite3_extended_errcode(handle) }

    /// Compiles a statement to be kept and re-used (SQLITE_PREPARE_PERSISTENT).
    /// `name` says what the statement does in error messages (the SQL when omitted).
    func prepare(_ sql: String, as name: String? = nil) throws(StoreError) -> SQLiteStatement {
        var statement: OpaquePointer?
        let code = sqlite3_prepare_v3(handle, sql, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &statement, nil)
        guard code == SQLITE_OK, let statement else {
            throw error(code, context: "prepare \"\(name ?? sql)\"")
        }
        return SQLiteStatement(statement, connection: self, name: name ?? sql)
    }

    /// Runs SQL without results or parameters (schema and pragmas only; data is always bound).
    func execute(_ sql: String) throws(StoreError) {
        var message: UnsafeMutablePointer<CChar>?
        let code = sqlite3_exec(handle, sql, nil, nil, &message)
        sqlite3_free(message)
        guard code == SQLITE_OK else { throw error(code, context: "execute \"\(sql)\"") }
    }

    /// Runs a statement that returns one integer (`PRAGMA user_version`, `count(*)`).
    func integer(_ sql: String) throws(StoreError) -> Int64 {
        let statement = try prepare(sql)
        guard try statement.step() else {
            throw StoreError(.other, "\"\(sql)\" returned no row")
        }
        defer { statement.reset() }
        return statement.int64(0)
    }

    /// Runs a statement that returns one text value (`PRAGMA journal_mode=WAL`).
    func text(_ sql: String) throws(StoreError) -> String {
        let statement = try prepare(sql)
        guard try statement.step() else {
            throw StoreError(.other, "\"\(sql)\" returned no row")
        }
        defer { statement.reset() }
        return statement.text(0)
    }

    /// The error for a failed call on this connection, read before anything else runs on it.
    func error(_ code: Int32, context: String) -> StoreError {
        Self.error(code, handle: handle, context: context)
    }

    static func error(_ code: Int32, handle: OpaquePointer, context: String) -> StoreError {
        let extended = sqlite3_extended_errcode(handle)
        // The handle's code is the more specific one when it belongs to this failure.
        let result = (extended & 0xff) == (code & 0xff) ? extended : code
        let systemErrno = sqlite3_system_errno(handle)
        let kind = SQLiteResult.kind(of: result, systemErrno: systemErrno)
        var message = "\(context): \(String(cString: sqlite3_errmsg(handle))) (SQLite code \(result)"
        if SQLiteResult.involvesOperatingSystem(result), systemErrno != 0 {
            message += ", \(String(cString: strerror(systemErrno)))"
        }
        message += ")"
        if let hint = SQLiteResult.hint(for: result) { message += "; " + hint }
        return StoreError(kind, message)
    }
}

extension SQLiteConnection {
    /// How long a statement waits for a lock another connection holds.
    func setBusyTimeout(milliseconds: Int32) throws(StoreError) {
        let code = sqlite3_busy_timeout(handle, milliseconds)
        guard code == SQLITE_OK else { throw error(code, context: "set the busy timeout") }
    }
}
