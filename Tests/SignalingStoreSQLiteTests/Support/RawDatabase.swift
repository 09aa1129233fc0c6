import CSQLite

/// Direct SQLite access, for making files the store must refuse (other applications'
/// databases, newer schema versions) and for looking at what it wrote.
final class RawDatabase {
    private let handle: OpaquePointer

    struct Failure: Error, CustomStringConvertible {
        let description: String
    }

    init(path: String) throws {
        var opened: OpaquePointer?
        let code = sqlite3_open_v2(path, &opened, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nil)
        guard code == SQLITE_OK, let opened else {
            sqlite3_close(opened)
            throw Failure(description: "open \(path): \(String(cString: sqlite3_errstr(code)))")
        }
        handle = opened
    }

    deinit {
        sqlite3_close(handle)
    }

    func execute(_ sql: String) throws {
        let code = sqlite3_exec(handle, sql, nil, nil, nil)
        guard code == SQLITE_OK else {
            throw Failure(description: "\(sql): \(String(cString: sqlite3_errmsg(handle)))")
        }
    }

    /// The first column of the first row, as text.
    func text(_ sql: String) throws -> String {
        var statement: OpaquePointer?
        guard sqlite3_prepare_v2(handle, sql, -1, &statement, nil) == SQLITE_OK, let statement else {
            throw Failure(description: "\(sql): \(String(cString: sqlite3_errmsg(handle)))")
        }
        defer { sqlite3_finalize(statement) }
        guard sqlite3_step(statement) == SQLITE_ROW, let text = sqlite3_column_text(statement, 0) else {
            throw Failure(description: "\(sql): no row")
        }
        return String(cString: text)
    }
}
