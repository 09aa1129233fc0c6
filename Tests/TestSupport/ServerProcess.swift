import Foundation
import SignalingSupport
#if canImport(Glibc)
import Glibc
#endif

/// A real `voipserver` subprocess on an ephemeral loopback port. Its log goes to a file;
/// the port is read from its `listening` line. Killed (SIGKILL) if still running when
/// released, so a failing test never leaves a server behind.
public final class ServerProcess {
    public let process: ChildProcess
    /// The plain listener's port; 0 with `--listen off`.
    public let port: UInt16
    /// The TLS listener's port (nil: no `--tls-listen`).
    public let tlsPort: UInt16?
    public let logPath: String
    /// The server's data directory (a fresh temporary one unless `--data-dir` was given).
    public let dataDirectory: String
    private let ownsDataDirectory: Bool

    public struct StartFailure: Error, CustomStringConvertible {
        public let description: String
    }

    /// Starts `voipserver <arguments>` (listening on 127.0.0.1:0 and with
    /// `--thread-placement off` unless they say otherwise) and waits until it listens (it
    /// reads the port from the info-level `listening` line: do not pass a higher log level).
    /// Unless the arguments name one, the server gets a fresh data directory, removed when
    /// this object goes away.
    ///
    /// `until`: wait for a log line with this event instead (such as `standby`: a node
    /// that does not listen yet); `port` is then 0, and `listeningPorts(after:)` finds the
    /// ports once it listens.
    ///
    /// `through`: a command line that runs the server (`prlimit ...`, `setpriv ...`): the
    /// server's path and arguments are appended to it.
    public init(_ arguments: [String] = [], until event: String? = nil, through: [String] = [], timeoutSeconds: Double = 30) throws {
        let unique = "\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        logPath = FileManager.default.temporaryDirectory.appendingPathComponent("voipserver-\(unique).log").path
        var arguments = arguments
        if let index = arguments.firstIndex(of: "--data-dir"), index + 1 < arguments.count {
            dataDirectory = arguments[index + 1]
            ownsDataDirectory = false
        } else {
            dataDirectory = FileManager.default.temporaryDirectory.appendingPathComponent("voipserver-data-\(unique)").path
            ownsDataDirectory = true
            arguments += ["--data-dir", dataDirectory]
        }
        if !arguments.contains("--listen") { arguments = ["--listen", "127.0.0.1:0"] + arguments }
        // Tests start many servers at once: automatic placement would pin every one's loop to
        // the first CPU and its store writer to the next. A test of placement names it.
        if !arguments.contains("--thread-placement") { arguments += ["--thread-placement", "off"] }
        let command = through + [ExecutableRun.path(of: "voipserver")] + arguments
        process = try ChildProcess.spawn(
            command[0], arguments: Array(command.dropFirst()),
            pipeInput: false, stdout: .file(logPath), stderr: .file(logPath))
        let clock = SystemClock()
        let deadline = clock.now() + .milliseconds(Int64(timeoutSeconds * 1000))
        while true {
            let log = (try? String(contentsOfFile: logPath, encoding: .utf8)) ?? ""
            if let event {
                if log.contains("event=\(event) ") || log.contains("\"event\":\"\(event)\"") {
                    (port, tlsPort) = (0, nil)
                    return
                }
            } else if let ports = Self.listeningPorts(in: log) {
                (port, tlsPort) = (ports.plain ?? 0, ports.tls)
                return
            }
            if let status = process.poll() {
                if ownsDataDirectory { try? FileManager.default.removeItem(atPath: dataDirectory) }
                throw StartFailure(description: "voipserver exited (\(ChildProcess.describe(status: status))): \(log)")
            }
            guard clock.now() < deadline else {
                if ownsDataDirectory { try? FileManager.default.removeItem(atPath: dataDirectory) }
                process.send(signal: SIGKILL)
                _ = process.waitForExit(timeoutSeconds: 5)
                throw StartFailure(description: "voipserver did not listen within \(timeoutSeconds) s: \(log)")
            }
            usleep(2_000)
        }
    }

    deinit {
        process.send(signal: SIGKILL)
        _ = process.waitForExit(timeoutSeconds: 10)
        unlink(logPath)
        if ownsDataDirectory { try? FileManager.default.removeItem(atPath: dataDirectory) }
    }

    /// Everything the server logged so far.
    public var log: String { (try? String(contentsOfFile: logPath, encoding: .utf8)) ?? "" }

    /// Waits until the server logs a `listening` line after the first `offset` bytes of its
    /// log (a standby that became active, again after stepping down) and returns its plain
    /// port; nil at the deadline or if the process exited.
    public func listeningPort(after offset: Int = 0, timeoutSeconds: Double = 30) -> UInt16? {
        let clock = SystemClock()
        let deadline = clock.now() + .milliseconds(Int64(timeoutSeconds * 1000))
        while clock.now() < deadline && process.poll() == nil {
            let text = String(decoding: Array(log.utf8.dropFirst(offset)), as: UTF8.self)
            if let ports = Self.listeningPorts(in: text) { return ports.plain }
            usleep(2_000)
        }
        return nil
    }

    /// Waits until the log, after its first `offset` bytes, contains `text`.
    public func waitForLog(_ text: String, after offset: Int = 0, timeoutSeconds: Double = 30) -> Bool {
        let clock = SystemClock()
        let deadline = clock.now() + .milliseconds(Int64(timeoutSeconds * 1000))
        while clock.now() < deadline {
            if String(decoding: Array(log.utf8.dropFirst(offset)), as: UTF8.self).contains(text) { return true }
            usleep(2_000)
        }
        return false
    }

    /// Sends SIGTERM and waits for the exit status.
    public func terminate(timeoutSeconds: Double = 30) -> Int32? {
        process.send(signal: SIGTERM)
        return process.waitForExit(timeoutSeconds: timeoutSeconds)
    }

    /// The ports of the `listening` line: nil before it is logged; a listener that is off
    /// (`addr=off`) or not configured has no port.
    static func listeningPorts(in log: String) -> (plain: UInt16?, tls: UInt16?)? {
        func port(_ address: Substring) -> UInt16? {
            address.lastIndex(of: ":").flatMap { UInt16(address[address.index(after: $0)...]) }
        }
        for line in log.split(separator: "\n") where line.contains("\"event\":\"listening\"") {
            // --log-format json
            func field(_ name: String) -> Substring? {
                guard let start = line.range(of: "\"\(name)\":\""), let end = line[start.upperBound...].firstIndex(of: "\"") else { return nil }
                return line[start.upperBound..<end]
            }
            return (field("addr").flatMap(port), field("tls_addr").flatMap(port))
        }
        for line in log.split(separator: "\n") where line.contains("event=listening") {
            let fields = line.split(separator: " ")
            func field(_ name: String) -> Substring? {
                fields.first { $0.hasPrefix("\(name)=") }.map { $0.dropFirst(name.count + 1) }
            }
            return (field("addr").flatMap(port), field("tls_addr").flatMap(port))
        }
        return nil
    }
}
