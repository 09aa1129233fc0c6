import SignalingSupport
#if canImport(Glibc)
import Glibc
#endif

func writeFile(_ path: String, _ text: String) -> Bool {
    guard let file = fopen(path, "w") else { return false }
    defer { fclose(file) }
    return fputs(text, file) >= 0
}

func removeFile(_ path: String) { unlink(path) }

/// The entry names of a directory (without "." and ".."); empty if it cannot be read.
func listDirectory(_ path: String) -> [String] {
    guard let directory = opendir(path) else { return [] }
    defer { closedir(directory) }
    var names: [String] = []
    while let entry = readdir(directory) {
        let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
        if name != "." && name != ".." { names.append(name) }
    }
    return names
}

/// The threads of process `pid`: each one's kernel id and name (`/proc/PID/task/TID/comm`,
/// what `top -H` shows); threads whose name cannot be read are left out.
func namedThreads(of pid: pid_t) -> [(tid: pid_t, name: String)] {
    listDirectory("/proc/\(pid)/task").compactMap { task in
        guard let tid = pid_t(task),
              let name = readTextFile("/proc/\(pid)/task/\(task)/comm")?.split(separator: "\n").first.map(String.init)
        else { return nil }
        return (tid, name)
    }
}

/// A log file for a library server: `logger` writes to it, `lines` reads it back.
final class LogFile {
    let path = "/tmp/voipserver-test-log-\(getpid())-\(UInt32.random(in: 0...UInt32.max)).log"
    private let fd: Int32
    let logger: Logger

    init(level: LogLevel = .info) {
        fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o600)
        logger = Logger(level: level, fileDescriptor: fd)
    }

    deinit {
        close(fd)
        unlink(path)
    }

    /// The lines logged so far with `event=NAME`.
    func lines(_ event: String) -> [String] {
        (readTextFile(path) ?? "").split(separator: "\n").map(String.init).filter { $0.contains("event=\(event) ") || $0.hasSuffix("event=\(event)") }
    }

    /// Waits (bounded) until `count` lines with `event=NAME` were logged.
    func waitFor(_ event: String, count: Int = 1, timeout: Duration = .seconds(10)) throws {
        let deadline = SystemClock().now() + timeout
        while lines(event).count < count {
            guard SystemClock().now() < deadline else {
                throw TestClient.Failure("no \(count) × event=\(event) in: \(readTextFile(path) ?? "")")
            }
            usleep(2_000)
        }
    }
}
