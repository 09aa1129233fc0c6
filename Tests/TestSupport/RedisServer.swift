import Foundation
import SignalingSupport
#if canImport(Glibc)
import Glibc
#endif

/// A real `redis-server` for a test: on 127.0.0.1 at a free port, its AOF and log in a
/// temporary directory of its own, in the foreground as this process's child. The
/// defaults are the durable setting the Redis store requires by default (AOF on, fsync
/// always, no RDB snapshots). It can be killed (-9) and started again on the same port and
/// directory, with what its AOF holds. Killed when released, so a failing test never
/// leaves one behind.
public final class RedisServer {
    public let directory: TemporaryDirectory
    public private(set) var port: UInt16
    public let settings: [String]
    private var process: ChildProcess?

    /// The Debian package's binary (Tools/ensure-deps installs it).
    public static let executable = "/usr/bin/redis-server"
    public static var isAvailable: Bool { access(executable, X_OK) == 0 }
    public static let durable = ["--appendonly", "yes", "--appendfsync", "always", "--save", ""]

    public struct Failure: Error, CustomStringConvertible {
        public let description: String
    }

    /// Starts a server with `settings` (redis.conf directives as arguments) and waits until
    /// it accepts connections.
    public init(settings: [String] = RedisServer.durable, timeoutSeconds: Double = 30) throws {
        directory = try TemporaryDirectory("redis-test")
        self.settings = settings
        port = 0
        // A free port is found by binding to port 0 and closing: another process may take
        // it in between, so a start that fails to bind is retried on a new one.
        var lastFailure: Error?
        for _ in 0..<5 {
            port = try unusedLoopbackPort()
            do {
                try start(timeoutSeconds: timeoutSeconds)
                return
            } catch {
                lastFailure = error
                guard log.contains("Address already in use") else { throw error }
            }
        }
        throw lastFailure!
    }

    deinit {
        kill()
    }

    /// Runs one command with `redis-cli` (Debian's redis-tools, which redis-server depends
    /// on) and returns its output: for tests of processes whose Redis client they cannot reach.
    public func cli(_ arguments: [String]) throws -> String {
        let run = try ExecutableRun.runProgram("/usr/bin/redis-cli", ["-h", "127.0.0.1", "-p", String(port)] + arguments, timeoutSeconds: 10)
        return run.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// `redis://127.0.0.1:PORT` (plus `suffix`, such as `/3`).
    public func url(_ suffix: String = "") -> String { "redis://127.0.0.1:\(port)\(suffix)" }

    public var logPath: String { directory.file("redis.log") }
    public var log: String { (try? String(contentsOfFile: logPath, encoding: .utf8)) ?? "" }
    public var isRunning: Bool { process != nil }

    /// Starts the server again (same port, directory and settings) after `kill`.
    public func start(timeoutSeconds: Double = 30) throws {
        precondition(process == nil, "already running")
        let logStart = (try? FileManager.default.attributesOfItem(atPath: logPath)[.size] as? Int) ?? 0
        let child = try ChildProcess.spawn(
            Self.executable,
            arguments: ["--port", String(port), "--bind", "127.0.0.1", "--dir", directory.path, "--logfile", logPath,
                        "--daemonize", "no", "--appendfilename", "appendonly.aof"] + settings,
            pipeInput: false, stdout: .discard, stderr: .discard)
        process = child
        let clock = SystemClock()
        let deadline = clock.now() + .milliseconds(Int64(timeoutSeconds * 1000))
        while true {
            let text = log
            let fresh = String(decoding: Array(text.utf8.dropFirst(logStart)), as: UTF8.self)
            if fresh.contains("Ready to accept connections") { return }
            if let status = child.poll() {
                process = nil
                throw Failure(description: "redis-server exited (\(ChildProcess.describe(status: status))): \(fresh)")
            }
            guard clock.now() < deadline else {
                kill()
                throw Failure(description: "redis-server was not ready within \(timeoutSeconds) s: \(fresh)")
            }
            usleep(2_000)
        }
    }

    /// SIGKILL, and waits for the exit: nothing after the last fsync survives.
    public func kill() {
        guard let process else { return }
        process.send(signal: SIGKILL)
        _ = process.waitForExit(timeoutSeconds: 10)
        self.process = nil
    }

    /// SIGSTOP / SIGCONT: a Redis that stops answering without closing its connections.
    public func pause() { process?.send(signal: SIGSTOP) }
    public func resume() { process?.send(signal: SIGCONT) }
}

/// A loopback TCP port nobody had bound a moment ago, for a process that must be told its
/// port before it listens (redis-server, a standby voipserver). Another process could take
/// it in between: good enough on a test machine, never for a server's own listener.
public func unusedLoopbackPort() throws -> UInt16 {
    let fd = try SocketCalls.openTCP(nonBlocking: false)
    defer { close(fd) }
    try SocketCalls.bind(fd, SocketCalls.socketAddress(0x7F00_0001, port: 0))
    guard let port = SocketCalls.localPort(fd) else { throw RedisServer.Failure(description: "getsockname: \(String(cString: strerror(errno)))") }
    return port
}
