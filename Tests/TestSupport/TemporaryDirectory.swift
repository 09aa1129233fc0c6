import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A fresh directory under the system's temporary directory, removed with its contents
/// when this object goes away. Each test makes its own, so tests never share files.
public final class TemporaryDirectory: Sendable {
    public let path: String

    public init(_ prefix: String = "voip-test") throws {
        var template = Array((NSTemporaryDirectory() + "\(prefix)-XXXXXX").utf8CString)
        guard let created = mkdtemp(&template) else {
            throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO)
        }
        path = String(cString: created)
    }

    deinit {
        // Permission tests leave read-only modes behind; restore them so that removal
        // works for an unprivileged user too.
        if let enumerator = FileManager.default.enumerator(atPath: path) {
            chmod(path, 0o700)
            for case let relative as String in enumerator { chmod(path + "/" + relative, 0o700) }
        }
        try? FileManager.default.removeItem(atPath: path)
    }

    /// A path inside the directory.
    public func file(_ name: String) -> String { path + "/" + name }
}
