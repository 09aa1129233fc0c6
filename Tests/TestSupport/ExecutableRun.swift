import Foundation
import SignalingSupport
#if canImport(Glibc)
import Glibc
#endif

/// Runs one of the package's executables as a real subprocess, with a deadline.
public struct ExecutableRun: Sendable {
    public var status: Int32
    public var stdout: String
    public var stderr: String

    public var exitCode: Int32 { (status >> 8) & 0xff }

    /// The build products directory (where the test bundle and the executables live).
    public static var productsDirectory: String {
        URL(fileURLWithPath: ChildProcess.currentExecutablePath()).deletingLastPathComponent().path
    }

    public static func path(of executable: String) -> String { productsDirectory + "/" + executable }

    /// Starts the executable and waits for it; kills it and records an issue after
    /// `timeoutSeconds`.
    public static func run(_ executable: String, _ arguments: [String], timeoutSeconds: Double) throws -> ExecutableRun {
        try run(executable, arguments, through: [], timeoutSeconds: timeoutSeconds)
    }

    /// Runs the executable through `wrapper` (a program and its arguments, e.g. one that
    /// drops a capability), which is handed the executable's path and arguments.
    public static func run(
        _ executable: String, _ arguments: [String], through wrapper: [String], timeoutSeconds: Double
    ) throws -> ExecutableRun {
        let command = wrapper + [path(of: executable)] + arguments
        return try runProgram(command[0], Array(command.dropFirst()), timeoutSeconds: timeoutSeconds, name: executable)
    }

    /// Runs any program (`openssl`, `/bin/sh`) by path, with the same deadline.
    public static func runProgram(
        _ program: String, _ arguments: [String], timeoutSeconds: Double, name: String? = nil
    ) throws -> ExecutableRun {
        let executable = name ?? program
        let directory = FileManager.default.temporaryDirectory
            .appendingPathComponent("voipload-test-\(getpid())-\(UInt32.random(in: 0...UInt32.max))")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let out = directory.appendingPathComponent("stdout").path
        let err = directory.appendingPathComponent("stderr").path
        let process = try ChildProcess.spawn(program, arguments: arguments, pipeInput: false, stdout: .file(out), stderr: .file(err))
        guard let status = process.waitForExit(timeoutSeconds: timeoutSeconds) else {
            process.send(signal: SIGKILL)
            _ = process.waitForExit(timeoutSeconds: 10)
            throw TimedOut(executable: executable, seconds: timeoutSeconds,
                           stderr: (try? String(contentsOfFile: err, encoding: .utf8)) ?? "")
        }
        return ExecutableRun(
            status: status, stdout: (try? String(contentsOfFile: out, encoding: .utf8)) ?? "",
            stderr: (try? String(contentsOfFile: err, encoding: .utf8)) ?? "")
    }

    public struct TimedOut: Error, CustomStringConvertible {
        public var executable: String
        public var seconds: Double
        public var stderr: String
        public var description: String { "\(executable) did not finish within \(seconds) s; stderr:\n\(stderr)" }
    }
}
