import SignalingSupport
import TestSupport
#if canImport(Glibc)
import Glibc
#endif

/// A small ext4 file system in an image file, loop-mounted on a fresh temporary directory,
/// that a test can freeze (`fsfreeze -f`): every write to it then blocks, uninterruptibly,
/// until it is thawed, as on a hung disk. Needs root and mkfs.ext4 (e2fsprogs), mount
/// (mount) and fsfreeze and setsid (util-linux); `unavailableReason` says what is missing.
///
/// A file system left frozen would hang every later writer to it, its unmount and, with
/// them, later test runs: `tearDown` (also run by `deinit`) thaws before it unmounts, and
/// while frozen a detached process of its own session thaws it after `safetyThaw` even if
/// this process dies meanwhile.
final class FreezableFileSystem {
    let mountPoint: String
    private let directory: TemporaryDirectory
    private var mounted = false
    private var frozen = false
    private var safetyThawer: ChildProcess?
    static let safetyThaw: Duration = .seconds(60)

    struct Failure: Error, CustomStringConvertible {
        let description: String
    }

    /// Why the file system cannot be made here (nil: it can), found out once.
    static let unavailableReason: String? = {
        guard getuid() == 0 else { return "mounting a loop device needs root" }
        for tool in ["mkfs.ext4", "mount", "fsfreeze", "setsid"] where executable(tool) == nil {
            return "\(tool) is not installed (Debian: e2fsprogs, mount, util-linux)"
        }
        do {
            _ = try FreezableFileSystem(sizeMegabytes: 8)
            return nil
        } catch {
            return "cannot mount a loop device: \(error)"
        }
    }()

    init(sizeMegabytes: Int) throws {
        directory = try TemporaryDirectory("voipserver-freezable")
        mountPoint = directory.file("mnt")
        let image = directory.file("ext4.img")
        try Self.run("dd", ["if=/dev/zero", "of=\(image)", "bs=1M", "count=\(sizeMegabytes)", "status=none"])
        try Self.run("mkfs.ext4", ["-q", "-F", image])
        guard mkdir(mountPoint, 0o700) == 0 else { throw Failure(description: "mkdir \(mountPoint): \(errno)") }
        try Self.run("mount", ["-o", "loop", image, mountPoint])
        mounted = true
    }

    deinit { tearDown() }

    /// Freezes the file system: writes to it block until `thaw`.
    func freeze() throws {
        guard !frozen else { return }
        let thawer = try ChildProcess.spawn(
            Self.executable("setsid")!,
            arguments: ["sh", "-c", "sleep \(Int(Self.safetyThaw.seconds)); exec fsfreeze -u '\(mountPoint)'"],
            pipeInput: false, stdout: .discard, stderr: .discard)
        safetyThawer = thawer
        do {
            try Self.run("fsfreeze", ["-f", mountPoint])
        } catch {
            stopSafetyThawer()
            throw error
        }
        frozen = true
    }

    /// Thaws the file system (nothing if it is not frozen).
    func thaw() {
        guard frozen else { return }
        // Only the thaw itself, never a write to this file system, may run while it is frozen.
        if (try? Self.run("fsfreeze", ["-u", mountPoint])) != nil { frozen = false }
        stopSafetyThawer()
    }

    /// Thaws, then unmounts (lazily, should a file still be open). Call it only once
    /// nothing writes to the file system any more, i.e. after the server was stopped.
    func tearDown() {
        thaw()
        guard mounted else { return }
        mounted = false
        umount2(mountPoint, Int32(MNT_DETACH))
    }

    private func stopSafetyThawer() {
        guard let thawer = safetyThawer else { return }
        safetyThawer = nil
        kill(-thawer.pid, SIGKILL)  // its session's process group: sh and its sleep
        kill(thawer.pid, SIGKILL)  // in case it had not made its session yet
        _ = thawer.waitForExit(timeoutSeconds: 5)
    }

    static func executable(_ name: String) -> String? {
        for directory in ["/usr/sbin", "/usr/bin", "/sbin", "/bin"] where access(directory + "/" + name, X_OK) == 0 {
            return directory + "/" + name
        }
        return nil
    }

    private static func run(_ tool: String, _ arguments: [String]) throws {
        guard let path = executable(tool) else { throw Failure(description: "\(tool) is not installed") }
        let process = try ChildProcess.spawn(path, arguments: arguments, pipeInput: false, stdout: .discard, stderr: .discard)
        guard let status = process.waitForExit(timeoutSeconds: 30) else {
            process.send(signal: SIGKILL)
            throw Failure(description: "\(tool) did not finish within 30 s")
        }
        guard status == 0 else {
            throw Failure(description: "\(tool) \(arguments.joined(separator: " ")): \(ChildProcess.describe(status: status))")
        }
    }
}
