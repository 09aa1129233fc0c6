import Foundation
import SignalingSupport
import TestSupport
#if canImport(Glibc)
import Glibc
#endif

/// A tmux server of the test's own (its socket in a fresh temporary directory, `-S`)
/// running one program in a pseudo-terminal: the test types with `send-keys` and reads the
/// screen with `capture-pane`. The server is killed and its socket removed when this
/// object goes away.
final class Tmux {
    static let executable = "/usr/bin/tmux"
    static var isAvailable: Bool { FileManager.default.isExecutableFile(atPath: executable) }

    struct Failure: Error, CustomStringConvertible {
        let description: String
    }

    private let directory: TemporaryDirectory
    private var socketPath: String { directory.file("tmux.sock") }

    /// Starts `command` (a shell command line) in a detached session of `columns` × `rows`.
    init(command: String, columns: Int = 120, rows: Int = 40) throws {
        directory = try TemporaryDirectory("voipclient-tmux")
        try run(["-f", "/dev/null", "new-session", "-d", "-x", "\(columns)", "-y", "\(rows)", command])
    }

    deinit { _ = try? run(["kill-server"]) }

    /// Types keys: text, or tmux key names such as "Enter", "C-u", "Left".
    func send(_ keys: String...) throws {
        try run(["send-keys", "-t", "0"] + keys)
    }

    /// The visible screen, lines joined with "\n" (wrapped lines are joined back).
    func screen() throws -> String {
        try run(["capture-pane", "-p", "-J", "-t", "0"])
    }

    /// Waits until the screen satisfies `condition`; returns the last screen seen.
    @discardableResult
    func waitForScreen(within timeout: Duration = .seconds(20), _ condition: (String) -> Bool) throws -> (matched: Bool, screen: String) {
        let deadline = SystemClock().now() + timeout
        while true {
            let text = (try? screen()) ?? ""
            if condition(text) { return (true, text) }
            guard SystemClock().now() < deadline else { return (false, text) }
            usleep(20_000)
        }
    }

    /// True while the session (and the program in it) is alive.
    var isRunning: Bool { (try? run(["has-session", "-t", "0"])) != nil }

    @discardableResult
    private func run(_ arguments: [String]) throws -> String {
        let output = directory.file("output-\(UInt32.random(in: 0...UInt32.max))")
        defer { unlink(output) }
        let process = try ChildProcess.spawn(Self.executable, arguments: ["-S", socketPath] + arguments, pipeInput: false,
                                             stdout: .file(output), stderr: .file(output))
        guard let status = process.waitForExit(timeoutSeconds: 10) else {
            process.send(signal: SIGKILL)
            _ = process.waitForExit(timeoutSeconds: 5)
            throw Failure(description: "tmux \(arguments.joined(separator: " ")) did not finish")
        }
        let text = (try? String(contentsOfFile: output, encoding: .utf8)) ?? ""
        guard status == 0 else { throw Failure(description: "tmux \(arguments.joined(separator: " ")): \(ChildProcess.describe(status: status)) \(text)") }
        return text
    }
}
