import CSQLite
import SignalingStore
#if canImport(Glibc)
import Glibc
#endif

/// How SQLite result codes map to what the server can do about them (`StoreError.Kind`).
enum SQLiteResult {
    /// The kind of a failed call. `systemErrno` refines I/O failures: SQLite reports a
    /// failed write as SQLITE_IOERR_WRITE, whether the disk was full, the file system was
    /// remounted read-only or the disk broke.
    static func kind(of result: Int32, systemErrno: Int32) -> StoreError.Kind {
        switch result & 0xff {
        case SQLITE_FULL:
            return .full
        case SQLITE_READONLY, SQLITE_PERM:
            return .readOnly
        case SQLITE_CANTOPEN:
            // Opening (or creating the -wal/-shm files) failed: almost always permissions
            // or a read-only file system; ENOSPC when the directory's disk is full.
            return isNoSpace(systemErrno) ? .full : .readOnly
        case SQLITE_IOERR:
            if isNoSpace(systemErrno) { return .full }
            if isNotWritable(systemErrno) { return .readOnly }
            return .io
        case SQLITE_CORRUPT, SQLITE_NOTADB:
            return .corrupt
        default:
            return .other
        }
    }

    /// Whether the operating system's errno is meaningful for this result.
    static func involvesOperatingSystem(_ result: Int32) -> Bool {
        switch result & 0xff {
        case SQLITE_IOERR, SQLITE_CANTOPEN, SQLITE_FULL, SQLITE_READONLY, SQLITE_PERM: return true
        default: return false
        }
    }

    /// What an operator should know beyond SQLite's own words, for results whose cause is
    /// not obvious from them.
    static func hint(for result: Int32) -> String? {
        switch result {
        case readOnlyDirectory:
            return "SQLite creates the -wal and -shm files beside the database, so the data directory must be writable"
        case SQLITE_NOTADB:
            return "it may belong to another program or be damaged; move it away or restore a backup"
        default:
            return nil
        }
    }

    /// SQLITE_READONLY_DIRECTORY (3.22+): the database is writable, its directory is not.
    static let readOnlyDirectory: Int32 = SQLITE_READONLY | (6 << 8)

    static func isNoSpace(_ code: Int32) -> Bool { code == ENOSPC || code == EDQUOT }
    static func isNotWritable(_ code: Int32) -> Bool { code == EROFS || code == EACCES || code == EPERM }
}
