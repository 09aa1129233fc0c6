import Foundation
import SignalingSupport
import TestSupport
#if canImport(Glibc)
import Glibc
#endif

/// A `voipclient` running in the background (a listener, a caller the test interrupts),
/// its output going to files the test reads while it runs. Killed if still running when
/// released, so a failing test leaves nothing behind.
final class VoipClientProcess {
    let process: ChildProcess
    private let directory: TemporaryDirectory

    init(_ arguments: [String]) throws {
        directory = try TemporaryDirectory("voipclient-process")
        process = try ChildProcess.spawn(ExecutableRun.path(of: "voipclient"), arguments: arguments, pipeInput: false,
                                         stdout: .file(directory.file("stdout")), stderr: .file(directory.file("stderr")))
    }

    deinit {
        process.send(signal: SIGKILL)
        _ = process.waitForExit(timeoutSeconds: 10)
    }

    var stdout: String { (try? String(contentsOfFile: directory.file("stdout"), encoding: .utf8)) ?? "" }
    var stderr: String { (try? String(contentsOfFile: directory.file("stderr"), encoding: .utf8)) ?? "" }

    /// Waits until stdout contains `text`; false at the deadline or if the process ended
    /// without printing it.
    func waitForOutput(_ text: String, within timeout: Duration = .seconds(20)) -> Bool {
        let deadline = SystemClock().now() + timeout
        while !stdout.contains(text) {
            if process.poll() != nil { return stdout.contains(text) }
            guard SystemClock().now() < deadline else { return false }
            usleep(5_000)
        }
        return true
    }

    /// The exit code, or nil if it is still running at the deadline.
    func exitCode(within seconds: Double = 30) -> Int32? {
        process.waitForExit(timeoutSeconds: seconds).map { ($0 >> 8) & 0xff }
    }
}

/// `--json` output, one object per line.
struct JSONLines {
    let objects: [[String: Any]]

    init(_ text: String) {
        objects = text.split(separator: "\n").compactMap {
            try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]
        }
    }

    func first(_ event: String) -> [String: Any]? { objects.first { $0["event"] as? String == event } }
    func all(_ event: String) -> [[String: Any]] { objects.filter { $0["event"] as? String == event } }
    var events: [String] { objects.compactMap { $0["event"] as? String } }
}

/// A loopback port nobody listens on (bound, read and released: connecting is refused).
func closedLoopbackPort() -> UInt16 {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
    defer { close(fd) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    _ = withUnsafeMutablePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { pointer -> Int32 in
            _ = bind(fd, pointer, length)
            return getsockname(fd, pointer, &length)
        }
    }
    return UInt16(bigEndian: address.sin_port)
}
