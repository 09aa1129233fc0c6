import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A fresh directory under the system's temporary directory, removed (with everything in
/// it) when released. Each test makes its own, so tests never share a database.
final class TemporaryDirectory {
    let path: String

    init() throws {
        var template = Array((NSTemporaryDirectory() + "sqlite-store-test-XXXXXX").utf8CString)
        guard let created = mkdtemp(&template) else {
            throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO)
        }
        path = String(cString: created)
    }

    deinit {
        // Permission tests leave read-only modes behind; restore them so removal works
        // for an unprivileged user too.
        if let enumerator = FileManager.default.enumerator(atPath: path) {
            chmod(path, 0o700)
            for case let relative as String in enumerator { chmod(path + "/" + relative, 0o700) }
        }
        try? FileManager.default.removeItem(atPath: path)
    }

    /// A path inside the directory.
    func appending(_ name: String) -> String { path + "/" + name }
}
