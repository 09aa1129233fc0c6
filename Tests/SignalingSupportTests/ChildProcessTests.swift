import Testing
@testable import SignalingSupport
#if canImport(Glibc)
import Glibc
#endif

@Suite("Child processes")
struct ChildProcessTests {
    @Test("our ends of a child's pipes are close-on-exec, so no later child inherits them")
    func pipesAreCloseOnExec() throws {
        let child = try ChildProcess.spawn("/bin/cat", arguments: [], pipeInput: true, stdout: .pipe, stderr: .discard)
        #expect(fcntl(child.input, F_GETFD) & FD_CLOEXEC != 0)
        #expect(fcntl(child.output, F_GETFD) & FD_CLOEXEC != 0)
        child.closeInput()
        #expect(child.waitForExit(timeoutSeconds: 10) == 0)
    }

    @Test("writing to the stdin of a child that has exited fails with EPIPE, not SIGPIPE; children keep SIGPIPE's default action")
    func writeToAnExitedChild() throws {
        let child = try ChildProcess.spawn("/bin/sleep", arguments: ["30"], pipeInput: true, stdout: .discard, stderr: .discard)
        // The child does not inherit the parent's ignored SIGPIPE (bit 13 of SigIgn).
        let status = readTextFile("/proc/\(child.pid)/status") ?? ""
        let ignored = status.split(separator: "\n").first { $0.hasPrefix("SigIgn:") }.flatMap { UInt64($0.split(separator: "\t").last ?? "", radix: 16) }
        #expect(ignored.map { $0 & (1 << (SIGPIPE - 1)) == 0 } == true, "\(status)")
        child.send(signal: SIGKILL)
        _ = child.waitForExit(timeoutSeconds: 10)
        var byte: UInt8 = 1
        let written = write(child.input, &byte, 1)
        #expect(written == -1 && errno == EPIPE)
    }

    @Test("closing a child's stdin ends its input once; the descriptor number is not closed again later")
    func closeInputClosesOnce() throws {
        // Tests run in parallel in this process: another thread may take the freed number
        // first, and then this one cannot watch it. Try until it gets it (a few times).
        for _ in 0..<20 {
            var child: ChildProcess? = try ChildProcess.spawn("/bin/cat", arguments: [], pipeInput: true, stdout: .discard, stderr: .discard)
            let number = try #require(child?.input)
            child?.closeInput()
            #expect(child?.input == -1)
            // cat reads end-of-file and exits.
            #expect(child?.waitForExit(timeoutSeconds: 10) == 0)
            // Another descriptor takes the freed number, as another thread's socket would
            // (F_DUPFD: the lowest free number from `number` up, which is `number` itself
            // unless another thread was quicker); releasing the child must leave it alone.
            let null = open("/dev/null", O_RDONLY | O_CLOEXEC)
            defer { close(null) }
            let reused = fcntl(null, F_DUPFD_CLOEXEC, number)
            defer { if reused >= 0 { close(reused) } }
            guard reused == number else { continue }
            child = nil
            #expect(fcntl(reused, F_GETFD) != -1, "the child's release closed a descriptor it no longer owned")
            return
        }
        Issue.record("another thread took the freed descriptor number every time")
    }
}
