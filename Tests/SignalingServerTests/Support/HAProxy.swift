import CLinuxShims
import SignalingSupport
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// A real haproxy (Debian package `haproxy`) in front of a test server, as in production:
/// TCP mode, forwarding each connection with `send-proxy-v2`. It is a subprocess of the
/// test with a generated configuration in a temporary directory (no system service),
/// killed when this object goes away. Its listening socket, on 127.0.0.1 and an ephemeral
/// port, is made here and handed to it (`bind fd@3`): the port is known before haproxy
/// starts, no other process can take it meanwhile, and a device can connect at once
/// (the kernel queues the connection until haproxy accepts it).
final class HAProxy {
    static let path: String? = ["/usr/sbin/haproxy", "/usr/bin/haproxy"].first { access($0, X_OK) == 0 }
    static let isAvailable = path != nil
    static let missingReason: Comment = "haproxy is not installed (Debian package haproxy; Tools/ensure-deps installs it)"

    let port: UInt16
    private let process: ChildProcess
    private let directory: TemporaryDirectory

    struct Failure: Error, CustomStringConvertible {
        let description: String
    }

    /// - Parameter serverOptions: more options for the `server` line, such as `check`.
    init(forwardingTo serverPort: UInt16, serverOptions: String = "") throws {
        guard let path = Self.path else { throw Failure(description: "\(Self.missingReason)") }
        directory = try TemporaryDirectory("haproxy")
        var listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        // Below 3 it would collide with the child's own standard descriptors; at 3 dup2
        // would leave it close-on-exec.
        if listener <= 3 {
            let higher = fcntl(listener, F_DUPFD_CLOEXEC, 10)
            close(listener)
            listener = higher
        }
        defer { close(listener) }  // the child has its own copy
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        inet_pton(AF_INET, "127.0.0.1", &address.sin_addr)
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(listener, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard listener >= 0, bound == 0, listen(listener, 64) == 0, shim_local_port(listener) > 0 else {
            throw Failure(description: "cannot listen on 127.0.0.1: \(String(cString: strerror(errno)))")
        }
        port = UInt16(shim_local_port(listener))
        let configuration = """
            global
                maxconn 256
            defaults
                mode tcp
                timeout connect 5s
                timeout client 1m
                timeout server 1m
            listen devices
                bind fd@3
                server voipserver 127.0.0.1:\(serverPort) send-proxy-v2 \(serverOptions)
            """
        guard writeFile(directory.file("haproxy.cfg"), configuration + "\n") else {
            throw Failure(description: "cannot write \(directory.file("haproxy.cfg"))")
        }
        // -db: stay in the foreground, one process, so that killing it stops everything.
        process = try ChildProcess.spawn(
            path, arguments: ["-db", "-f", directory.file("haproxy.cfg")], pipeInput: false,
            stdout: .file(directory.file("haproxy.log")), stderr: .file(directory.file("haproxy.log")),
            inheriting: [3: listener])
    }

    deinit {
        process.send(signal: SIGKILL)
        _ = process.waitForExit(timeoutSeconds: 10)
    }

    /// What haproxy printed, and whether it still runs: for a failing test's message.
    var diagnostics: String {
        let state = process.poll().map { "exited (\(ChildProcess.describe(status: $0)))" } ?? "running"
        return "haproxy \(state): \(readTextFile(directory.file("haproxy.log")) ?? "")"
    }
}
