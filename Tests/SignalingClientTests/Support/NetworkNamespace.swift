import Foundation
import CLinuxShims
import SignalingSupport
#if canImport(Glibc)
import Glibc
#endif

/// Network namespaces created for one test with `ip netns add`, removed (with every
/// interface in them) when the object goes away, also when the test fails. Names carry
/// the process id and a random part so parallel runs never collide.
final class NetworkNamespaces {
    static let ipPath: String? = {
        let candidates: [String] = ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"]
        return candidates.first { FileManager.default.isExecutableFile(atPath: $0) }
    }()

    /// True when this process may create namespaces (root, iproute2 installed).
    static var isSupported: Bool { getuid() == 0 && ipPath != nil }

    private(set) var names: [String] = []
    let tag = "\(getpid() % 100_000)-\(UInt32.random(in: 0..<1_000_000))"

    deinit {
        for name in names { _ = try? Self.ip(["netns", "del", name]) }
    }

    /// Creates `vsig-<role>-<tag>` and returns its name.
    func create(_ role: String) throws -> String {
        let name = "vsig-\(role)-\(tag)"
        try Self.ip(["netns", "add", name])
        names.append(name)
        return name
    }

    /// Runs `ip ARGS` and fails on a non-zero exit.
    @discardableResult
    static func ip(_ arguments: [String]) throws -> Int32 {
        guard let ipPath else { throw FixtureError("iproute2 is not installed") }
        let child = try ChildProcess.spawn(ipPath, arguments: arguments, pipeInput: false, stdout: .discard, stderr: .discard)
        guard let status = child.waitForExit(timeoutSeconds: 10) else {
            child.send(signal: SIGKILL)
            _ = child.waitForExit(timeoutSeconds: 5)
            throw FixtureError("ip \(arguments.joined(separator: " ")) did not finish")
        }
        guard status == 0 else { throw FixtureError("ip \(arguments.joined(separator: " ")) failed: \(ChildProcess.describe(status: status))") }
        return status
    }

    /// Runs `body` on a fresh thread that has entered namespace `name`: sockets it creates
    /// (and threads it starts) live in that namespace.
    static func run<T>(inNamespace name: String, _ body: @escaping @Sendable () throws -> T) throws -> T {
        let value = AsyncValue<T>()
        Thread.detachNewThread {
            guard vsig_enter_network_namespace("/var/run/netns/\(name)") == 0 else {
                value.set(.failure(FixtureError("setns \(name): \(String(cString: strerror(errno)))")))
                return
            }
            value.set(Result { try body() })
        }
        return try value.value(within: 10)
    }
}

/// Reads a child's stdout line by line with deadlines.
final class LineReader {
    let descriptor: Int32
    private var buffer: [UInt8] = []
    private(set) var lines: [String] = []

    init(descriptor: Int32) { self.descriptor = descriptor }

    /// Reads until a line containing `text` arrives; returns it.
    func waitForLine(containing text: String, within timeout: Duration = .seconds(10)) throws -> String {
        let deadline = SystemClock().now() + timeout
        var checked = 0
        while true {
            while checked < lines.count {
                defer { checked += 1 }
                if lines[checked].contains(text) { return lines[checked] }
            }
            let now = SystemClock().now()
            guard now < deadline, waitReadable(descriptor, deadline - now) else {
                throw FixtureError("no line containing '\(text)' within \(timeout); got:\n\(lines.joined(separator: "\n"))")
            }
            var chunk = [UInt8](repeating: 0, count: 4096)
            let count = chunk.withUnsafeMutableBytes { read(descriptor, $0.baseAddress, $0.count) }
            guard count > 0 else { throw FixtureError("output closed; got:\n\(lines.joined(separator: "\n"))") }
            buffer.append(contentsOf: chunk[0..<count])
            while let newline = buffer.firstIndex(of: 10) {
                lines.append(String(decoding: buffer[..<newline], as: UTF8.self))
                buffer.removeSubrange(...newline)
            }
        }
    }
}
