import TestSupport
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A small tmpfs mounted on a fresh temporary directory, for a disk that really fills up.
/// Mounting needs CAP_SYS_ADMIN (root in most containers); tests that use it are enabled
/// only where `isAvailable`.
final class ScratchFileSystem {
    let path: String
    private var mounted = true

    struct Unavailable: Error, CustomStringConvertible {
        let description: String
    }

    init(sizeBytes: Int) throws {
        var template = Array((NSTemporaryDirectory() + "sqlite-store-tmpfs-XXXXXX").utf8CString)
        guard let created = mkdtemp(&template) else { throw Unavailable(description: "mkdtemp: \(String(cString: strerror(errno)))") }
        path = String(cString: created)
        guard mount("tmpfs", path, "tmpfs", 0, "size=\(sizeBytes),mode=0700") == 0 else {
            let reason = String(cString: strerror(errno))
            rmdir(path)
            throw Unavailable(description: "mount tmpfs on \(path): \(reason)")
        }
    }

    deinit {
        unmount()
    }

    /// Unmounts (lazily, should a file still be open) and removes the mount point.
    func unmount() {
        guard mounted else { return }
        mounted = false
        umount2(path, Int32(MNT_DETACH))
        rmdir(path)
    }

    /// Whether this process may mount a tmpfs, tried once.
    static let isAvailable: Bool = (try? ScratchFileSystem(sizeBytes: 65_536)) != nil
}
