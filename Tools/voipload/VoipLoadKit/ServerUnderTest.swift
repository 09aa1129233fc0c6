#if canImport(Glibc)
import SignalingSupport
import Glibc
#endif

/// The server being measured: either one already running (known by its pid, or not at
/// all) or one this tool starts, which lets it measure a restart storm.
final class ServerUnderTest {
    let endpoint: (address: UInt32, port: UInt16)
    private let binary: String?
    private let arguments: [String]
    private let logPath: String?
    private var process: ChildProcess?
    private(set) var pid: Int32?

    /// An external server, optionally with its pid for memory and CPU figures.
    init(endpoint: (address: UInt32, port: UInt16), pid: Int32?) {
        self.endpoint = endpoint
        self.pid = pid
        binary = nil
        arguments = []
        logPath = nil
    }

    /// A server this tool starts: `binary --listen HOST:PORT [--auth-secret S] [--auth-key-file F] extra...`,
    /// or with `tls`, `binary --tls-listen HOST:PORT ...`: a TLS-only server, whose
    /// `--tls-cert` and `--tls-key` come with the extra arguments.
    init(
        endpoint: (address: UInt32, port: UInt16), binary: String, authSecret: String?, authKeyFile: String?,
        tls: Bool = false, extraArguments: [String], logPath: String?
    ) {
        self.endpoint = endpoint
        self.binary = binary
        var arguments = [tls ? "--tls-listen" : "--listen", "\(SocketCalls.dottedQuad(endpoint.address)):\(endpoint.port)"]
        if let authSecret { arguments += ["--auth-secret", authSecret] }
        if let authKeyFile { arguments += ["--auth-key-file", authKeyFile] }
        self.arguments = arguments + extraArguments
        self.logPath = logPath
    }

    var canRestart: Bool { binary != nil }
    var address: String { "\(SocketCalls.dottedQuad(endpoint.address)):\(endpoint.port)" }

    /// Starts the server (if this tool owns it) and waits until it accepts connections.
    func start(timeoutSeconds: Double) throws(LoadError) {
        if binary != nil { try launch() }
        try waitUntilAccepting(timeoutSeconds: timeoutSeconds)
    }

    private func waitUntilAccepting(timeoutSeconds: Double) throws(LoadError) {
        let deadline = monotonicSeconds() + timeoutSeconds
        while true {
            guard let error = SocketCalls.canConnect(to: endpoint, timeoutMilliseconds: 1000) else { return }
            if let status = process?.poll() {
                throw LoadError("the server exited during start-up (\(ChildProcess.describe(status: status))); arguments: \(arguments.joined(separator: " "))")
            }
            if monotonicSeconds() >= deadline {
                throw LoadError("cannot connect to the server at \(address): \(error.reason)")
            }
            usleep(20_000)
        }
    }

    /// SIGTERM, so the server drains (CLOSE goingAway to every client); returns at once:
    /// poll `hasExited` while the clients are served.
    func beginDrain() {
        process?.send(signal: SIGTERM)
    }

    var hasExited: Bool { process?.poll() != nil || process == nil }

    /// Starts the server again after a drain, without waiting for it to listen (the
    /// devices' own reconnects find out when it does).
    func launch() throws(LoadError) {
        guard let binary else { throw LoadError("only a server started with --server-bin can be restarted") }
        let log: ChildProcess.Output = logPath.map { .file($0) } ?? .inherit
        do {
            process = try ChildProcess.spawn(binary, arguments: arguments, pipeInput: false, stdout: log, stderr: log)
        } catch {
            throw LoadError("cannot start the server \(binary): \(error.reason)")
        }
        pid = process?.pid
    }

    /// Stops a server this tool started; leaves an external one alone.
    func stop() {
        guard let process else { return }
        process.send(signal: SIGTERM)
        if process.waitForExit(timeoutSeconds: 15) == nil {
            process.send(signal: SIGKILL)
            _ = process.waitForExit(timeoutSeconds: 5)
        }
        self.process = nil
    }

    /// Whether a server this tool started has died on its own.
    var exitedUnexpectedly: String? {
        guard let status = process?.poll() else { return nil }
        return ChildProcess.describe(status: status)
    }
}

/// A load run that cannot go on; printed as "voipload: <message>", exit status 1.
public struct LoadError: Error, Sendable, CustomStringConvertible {
    public var message: String
    public init(_ message: String) { self.message = message }
    public var description: String { message }
}
