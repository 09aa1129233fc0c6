import CLinuxShims
#if canImport(Glibc)
import Glibc
#endif

/// A process started with posix_spawn, optionally with pipes to its stdin and stdout.
/// Used by voipload for its workers and the server under test, and by the tests that
/// drive the executables.
public final class ChildProcess {
    public enum Output: Sendable {
        case inherit
        case pipe
        /// Appended to the file at this path.
        case file(String)
        case discard
    }

    public let pid: pid_t
    /// Our end of its stdin, when piped; -1 once `closeInput` closed it.
    public private(set) var input: Int32
    /// Our end of its stdout, when piped.
    public let output: Int32
    public private(set) var exitStatus: Int32?

    private init(pid: pid_t, input: Int32, output: Int32) {
        self.pid = pid
        self.input = input
        self.output = output
    }

    deinit {
        if input >= 0 { close(input) }
        if output >= 0 { close(output) }
    }

    /// Closes our end of its stdin (the child reads end-of-file), once: the descriptor
    /// is forgotten, so `deinit` does not close the same number again, by then perhaps
    /// another thread's socket.
    public func closeInput() {
        guard input >= 0 else { return }
        close(input)
        input = -1
    }

    /// - Parameter inheriting: descriptors the child gets, by their number in the child
    ///   (3 and up): such as a listening socket handed to a server (haproxy's `fd@3`), so
    ///   that its port is known before it starts and no other process can take it. A
    ///   descriptor must not already have its number in the child (dup2 would keep it
    ///   close-on-exec).
    public static func spawn(
        _ path: String, arguments: [String], pipeInput: Bool, stdout: Output, stderr: Output,
        inheriting: [Int32: Int32] = [:]
    ) throws(SystemError) -> ChildProcess {
        // Writing to the stdin of a child that has exited raises SIGPIPE, which would kill
        // this process (a test runner, a benchmark) instead of failing the write with
        // EPIPE. The child gets the default disposition back (POSIX_SPAWN_SETSIGDEF below):
        // an ignored signal would otherwise be inherited across exec.
        if pipeInput { signal(SIGPIPE, SIG_IGN) }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        var parentEnds: [Int32] = []
        var childEnds: [Int32] = []
        defer { for fd in childEnds { close(fd) } }
        func makePipe() throws(SystemError) -> (read: Int32, write: Int32) {
            var fds: [Int32] = [-1, -1]
            // Close-on-exec from the start, so no other child (a restarted server, or a
            // process another thread spawns meanwhile) inherits them.
            guard shim_cloexec_pipe(&fds) == 0 else {
                for fd in parentEnds { close(fd) }
                throw SystemError("pipe", errno)
            }
            return (fds[0], fds[1])
        }

        var input: Int32 = -1
        if pipeInput {
            let fds = try makePipe()
            input = fds.write
            parentEnds.append(fds.write)
            childEnds.append(fds.read)
            posix_spawn_file_actions_adddup2(&actions, fds.read, 0)
        } else {
            posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        }
        var output: Int32 = -1
        for (target, choice) in [(Int32(1), stdout), (Int32(2), stderr)] {
            switch choice {
            case .inherit:
                break
            case .discard:
                posix_spawn_file_actions_addopen(&actions, target, "/dev/null", O_WRONLY, 0)
            case .file(let path):
                posix_spawn_file_actions_addopen(&actions, target, path, O_WRONLY | O_CREAT | O_APPEND, 0o644)
            case .pipe:
                let fds = try makePipe()
                output = fds.read
                parentEnds.append(fds.read)
                childEnds.append(fds.write)
                posix_spawn_file_actions_adddup2(&actions, fds.write, target)
            }
        }

        for (target, source) in inheriting {
            // dup2 clears close-on-exec on the child's copy only.
            posix_spawn_file_actions_adddup2(&actions, source, target)
        }

        let argv = ([path] + arguments).map { strdup($0) } + [nil]
        defer { for pointer in argv { free(pointer) } }
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var defaults = sigset_t()
        sigemptyset(&defaults)
        sigaddset(&defaults, SIGPIPE)
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGDEF))
        var pid: pid_t = 0
        let result = posix_spawn(&pid, path, &actions, &attributes, argv, environ)
        guard result == 0 else {
            for fd in parentEnds { close(fd) }
            throw SystemError("start \(path)", result)
        }
        return ChildProcess(pid: pid, input: input, output: output)
    }

    /// Reaps the process if it has exited; returns its wait status then.
    @discardableResult
    public func poll() -> Int32? {
        if let exitStatus { return exitStatus }
        var status: Int32 = 0
        let result = waitpid(pid, &status, WNOHANG)
        if result == pid { exitStatus = status }
        return exitStatus
    }

    /// Waits for the process to exit; nil if it is still running at the deadline.
    public func waitForExit(timeoutSeconds: Double) -> Int32? {
        let clock = SystemClock()
        let deadline = clock.now() + .milliseconds(Int64(timeoutSeconds * 1000))
        while poll() == nil {
            if clock.now() >= deadline { return nil }
            usleep(5_000)
        }
        return exitStatus
    }

    public func send(signal number: Int32) {
        if poll() == nil { kill(pid, number) }
    }

    /// "exit status 3" or "killed by signal 9", for error messages.
    public static func describe(status: Int32) -> String {
        let signalNumber = status & 0x7f
        if signalNumber == 0 { return "exit status \((status >> 8) & 0xff)" }
        return "killed by signal \(signalNumber)"
    }

    /// The absolute path of the running executable (to re-execute oneself, or to find
    /// sibling executables in the same build directory).
    public static func currentExecutablePath() -> String {
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        let length = readlink("/proc/self/exe", &buffer, buffer.count - 1)
        guard length > 0 else { return CommandLine.arguments[0] }
        return String(decoding: buffer[0..<length].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}
