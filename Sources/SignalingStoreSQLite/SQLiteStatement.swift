import CSQLite
import SignalingStore

/// A compiled statement, kept for the life of its connection and re-used: bind, run,
/// and it is reset for the next use. Confined like its connection.
final class SQLiteStatement {
    private let handle: OpaquePointer
    /// Kept so the connection outlives (is closed after) its statements.
    private let connection: SQLiteConnection
    /// What the statement does, for error messages.
    let name: String

    init(_ handle: OpaquePointer, connection: SQLiteConnection, name: String) {
        self.handle = handle
        self.connection = connection
        self.name = name
    }

    deinit {
        sqlite3_finalize(handle)
    }

    // MARK: Parameters (1-based, as in SQL's ?1, ?2, ...)

    func bind(_ index: Int32, _ value: Int64) throws(StoreError) {
        try check(sqlite3_bind_int64(handle, index, value), index)
    }

    func bind(_ index: Int32, _ value: String) throws(StoreError) {
        var text = value
        // By length, not NUL-terminated: ids may contain any Unicode, U+0000 included.
        let code = text.withUTF8 { utf8 -> Int32 in
            guard let base = utf8.baseAddress, !utf8.isEmpty else {
                return sqlite3_bind_text(handle, index, "", 0, csqlite_transient())
            }
            guard utf8.count <= Int32.max else { return SQLITE_TOOBIG }
            return base.withMemoryRebound(to: CChar.self, capacity: utf8.count) {
                sqlite3_bind_text(handle, index, $0, Int32(utf8.count), csqlite_transient())
            }
        }
        try check(code, index)
    }

    func bind(_ index: Int32, _ value: String?) throws(StoreError) {
        if let value { try bind(index, value) } else { try bindNull(index) }
    }

    /// Binds a blob; an empty one is stored as an empty blob, never as NULL.
    func bind(_ index: Int32, _ bytes: [UInt8]) throws(StoreError) {
        let code: Int32
        if bytes.isEmpty {
            code = sqlite3_bind_zeroblob(handle, index, 0)
        } else {
            code = bytes.withUnsafeBytes { buffer -> Int32 in
                guard buffer.count <= Int32.max else { return SQLITE_TOOBIG }
                return sqlite3_bind_blob(handle, index, buffer.baseAddress, Int32(buffer.count), csqlite_transient())
            }
        }
        try check(code, index)
    }

    func bind(_ index: Int32, _ bytes: [UInt8]?) throws(StoreError) {
        if let bytes { try bind(index, bytes) } else { try bindNull(index) }
    }

    func bindNull(_ index: Int32) throws(StoreError) {
        try check(sqlite3_bind_null(handle, index), index)
    }

    private func check(_ code: Int32, _ index: Int32) throws(StoreError) {
        guard code == SQLITE_OK else {
            let context = "bind parameter \(index) of \(name)"
            if code == SQLITE_TOOBIG { throw StoreError(.other, "\(context): string or blob too big") }
            throw connection.error(code, context: context)
        }
    }

    // MARK: Running

    /// Runs a statement that returns no rows, then resets it.
    func run() throws(StoreError) {
        defer { reset() }
        let code = sqlite3_step(handle)
        guard code == SQLITE_DONE else {
            throw connection.error(code, context: code == SQLITE_ROW ? "unexpected row from \(name)" : "run \(name)")
        }
    }

    /// Steps a query: true when a row is ready to be read, false when done. The caller
    /// resets the statement when it has read what it needs.
    func step() throws(StoreError) -> Bool {
        let code = sqlite3_step(handle)
        switch code {
        case SQLITE_ROW: return true
        case SQLITE_DONE: return false
        default:
            let error = connection.error(code, context: "query \(name)")
            reset()
            throw error
        }
    }

    /// Makes the statement ready for the next use and releases its read snapshot. The
    /// previous failure, which sqlite3_reset repeats, was already reported.
    func reset() {
        sqlite3_reset(handle)
    }

    // MARK: Columns of the current row (0-based)

    func isNull(_ column: Int32) -> Bool {
        sqlite3_column_type(handle, column) == SQLITE_NULL
    }

    func int64(_ column: Int32) -> Int64 {
        sqlite3_column_int64(handle, column)
    }

    func text(_ column: Int32) -> String {
        // The pointer first, then the length (the order SQLite documents).
        guard let pointer = sqlite3_column_text(handle, column) else { return "" }
        let count = Int(sqlite3_column_bytes(handle, column))
        return String(decoding: UnsafeBufferPointer(start: pointer, count: count), as: UTF8.self)
    }

    func optionalText(_ column: Int32) -> String? {
        isNull(column) ? nil : text(column)
    }

    func blob(_ column: Int32) -> [UInt8] {
        guard let pointer = sqlite3_column_blob(handle, column) else { return [] }
        let count = Int(sqlite3_column_bytes(handle, column))
        return Array(UnsafeRawBufferPointer(start: pointer, count: count))
    }

    func optionalBlob(_ column: Int32) -> [UInt8]? {
        isNull(column) ? nil : blob(column)
    }
}
