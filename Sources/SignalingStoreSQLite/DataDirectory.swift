import SignalingStore
import SignalingSupport
#if canImport(Glibc)
import Glibc
#endif

/// The data directory: created on first use, and locked by the one process using it.
enum DataDirectory {
    /// Creates the directory and any missing parents (mode 0700: it holds users' messages).
    static func create(_ path: String) throws(StoreError) {
        guard !path.isEmpty else { throw StoreError(.other, "the data directory path is empty") }
        var prefix = path.hasPrefix("/") ? "/" : ""
        for component in path.split(separator: "/") {
            prefix += component
            if mkdir(prefix, 0o700) != 0 && errno != EEXIST {
                throw error("create the data directory \(prefix)", errno)
            }
            prefix += "/"
        }
        var status = stat()
        guard stat(path, &status) == 0 else { throw error("inspect the data directory \(path)", errno) }
        guard status.st_mode & S_IFMT == S_IFDIR else {
            throw StoreError(.other, "the data directory \(path) exists but is not a directory")
        }
    }

    static func error(_ action: String, _ code: Int32) -> StoreError {
        let reason = String(cString: strerror(code))
        let kind: StoreError.Kind = SQLiteResult.isNotWritable(code) ? .readOnly
            : SQLiteResult.isNoSpace(code) ? .full : .io
        return StoreError(kind, "\(action): \(reason)")
    }
}

/// An exclusive flock(2) on the lock file beside the database, held while the store is
/// open. Two servers writing the same data directory would each believe their own memory;
/// the second one is refused instead. The kernel drops the lock when the process dies,
/// kill -9 included, so there is nothing stale to clean up.
///
/// A separate file, not the database: closing any descriptor of the database file would
/// release SQLite's own POSIX locks on it.
final class DataDirectoryLock {
    private let descriptor: Int32

    /// How long a lock held by someone else is waited for before the directory counts as
    /// in use. A process that is starting a child holds a copy of every descriptor (and so
    /// of the lock) for the few microseconds until the child's exec closes it: a store closed
    /// and reopened at that moment must not be refused.
    static let patience: Duration = .milliseconds(500)

    init(path: String) throws(StoreError) {
        let descriptor = open(path, O_RDONLY | O_CREAT | O_CLOEXEC, 0o600)
        guard descriptor >= 0 else { throw DataDirectory.error("open the lock file \(path)", errno) }
        let clock = SystemClock()
        let deadline = clock.now() + Self.patience
        var code: Int32
        while true {
            do {
                try SystemCall.run("flock") { flock(descriptor, LOCK_EX | LOCK_NB) }
                code = 0
            } catch {
                code = error.code
            }
            guard code == EWOULDBLOCK, clock.now() < deadline else { break }
            usleep(2_000)
        }
        guard code == 0 else {
            close(descriptor)
            if code == EWOULDBLOCK {
                throw StoreError(.other, "the data directory is in use: another process holds \(path); "
                    + "only one server may use a data directory at a time")
            }
            throw DataDirectory.error("lock \(path)", code)
        }
        self.descriptor = descriptor
    }

    deinit {
        close(descriptor)  // releases the lock
    }
}
