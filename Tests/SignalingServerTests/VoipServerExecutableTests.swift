import SignalingProtocol
import SignalingServer
import SignalingSupport
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// The `voipserver` executable as operators run it: a real subprocess.
@Suite("voipserver executable")
struct VoipServerExecutableTests {
    @Test("--help documents every option and exits 0")
    func help() throws {
        let run = try ExecutableRun.run("voipserver", ["--help"], timeoutSeconds: 30)
        #expect(run.exitCode == 0)
        for option in ServerOptions.parser.options {
            #expect(run.stdout.contains("--\(option.name)"), "--help does not mention --\(option.name)")
        }
        #expect(run.stdout.contains("SIGTERM"))
    }

    @Test("--version prints the name and the one shared version, and exits 0", arguments: [
        "voipserver", "voipclient", "voipload", "signaling-client-probe", "store-bench", "reference-probe",
    ])
    func version(executable: String) throws {
        let run = try ExecutableRun.run(executable, ["--version"], timeoutSeconds: 30)
        #expect(run.exitCode == 0, "\(run.stderr)")
        #expect(run.stdout == "\(executable) \(ProductVersion.current)\n")
        let help = try ExecutableRun.run(executable, ["--help"], timeoutSeconds: 30)
        #expect(help.stdout.contains("--version"), "\(executable) --help does not mention --version")
    }

    @Test("the listening line names the version and the listen backlog")
    func listeningLine() throws {
        let server = try ServerProcess(["--store", "memory"])
        let line = server.log.split(separator: "\n").first { $0.contains("event=listening") } ?? ""
        #expect(line.contains(" version=\(ProductVersion.current) "), "\(line)")
        #expect(line.contains(" backlog=\(ServerConfiguration.systemMaxListenBacklog()) "), "\(line)")
    }

    @Test("bad usage prints the reason and exits 64", arguments: [
        ["--keepalive", "599"], ["--no-such-option"], ["--listen", "localhost"], ["--workers", "many"],
    ])
    func badUsage(arguments: [String]) throws {
        let run = try ExecutableRun.run("voipserver", arguments, timeoutSeconds: 30)
        #expect(run.exitCode == 64)
        #expect(run.stderr.hasPrefix("voipserver: "))
        #expect(run.stderr.contains("--help"))
    }

    @Test("a port already in use is a start failure with exit 70")
    func portInUse() throws {
        let first = try ServerProcess()
        // The loops share the port with SO_REUSEPORT, which would also let a second server
        // join silently and take half the devices; it must be refused instead.
        let run = try ExecutableRun.run(
            "voipserver", ["--listen", "127.0.0.1:\(first.port)", "--store", "memory"], timeoutSeconds: 30)
        #expect(run.exitCode == 70)
        #expect(run.stderr.contains("event=start_failed") && run.stderr.contains("Address already in use"), "\(run.stderr)")
        _ = first
    }

    @Test("a data directory that cannot be used is a start failure with a clear message")
    func unusableDataDirectory() throws {
        let scratch = try TemporaryDirectory("voipserver-baddata")
        let file = scratch.file("not-a-directory")
        #expect(writeFile(file, "x"))
        let run = try ExecutableRun.run("voipserver", ["--listen", "127.0.0.1:0", "--data-dir", file], timeoutSeconds: 30)
        #expect(run.exitCode == 70)
        #expect(run.stderr.contains("event=start_failed") && run.stderr.contains(file), "\(run.stderr)")
    }

    @Test("serves devices, logs structured lines, and drains on SIGTERM with exit 0")
    func servesAndDrains() throws {
        let server = try ServerProcess(["--drain-retry-after", "2", "--drain-jitter", "7", "--keepalive", "900"])
        let client = try RawSocket(port: server.port)
        try client.send(.hello(Hello(userID: "alice", deviceID: "phone")))
        guard case .welcome(let welcome)? = try client.next() else { Issue.record("no WELCOME"); return }
        #expect(welcome.keepAliveSeconds == 900)
        #expect(welcome.idleTimeoutSeconds == 1350)

        let status = server.terminate()
        guard case .close(let close)? = try client.next() else { Issue.record("no CLOSE on drain"); return }
        #expect(close.code == .goingAway)
        #expect(close.retryAfterMs == 2000 && close.retryJitterMs == 7000)
        #expect(status.map { ($0 >> 8) & 0xff } == 0)
        #expect(server.log.contains("event=listening"))
        #expect(server.log.contains("event=signal signal=SIGTERM"))
        #expect(server.log.contains("event=stopped"))
    }

    @Test("--cpu-latency-limit holds a PM QoS request while the server runs, or warns where the host refuses it")
    func cpuLatencyLimit() throws {
        let server = try ServerProcess(["--cpu-latency-limit", "0", "--store", "memory"])
        let heldPaths = { openFiles(of: server.process.pid).filter { $0 == CPULatencyRequest.devicePath } }
        if access(CPULatencyRequest.devicePath, W_OK) == 0 {
            #expect(heldPaths().count == 1, "the server does not hold \(CPULatencyRequest.devicePath)")
            // The kernel takes the lowest request of all processes: ours is 0.
            #expect(CPULatencyRequest.currentLimit() == 0)
            #expect(server.log.contains("cpu_latency_limit=0us"), "\(server.log)")
        } else {
            #expect(heldPaths().isEmpty)
            #expect(server.log.contains("event=cpu_latency_limit_unavailable"), "\(server.log)")
            #expect(server.log.contains("cpu_latency_limit=none"), "\(server.log)")
        }
        // Either way the server serves.
        let client = try RawSocket(port: server.port)
        try client.send(.hello(Hello(userID: "alice", deviceID: "phone")))
        guard case .welcome? = try client.next() else { Issue.record("no WELCOME"); return }
        #expect(server.terminate().map { ($0 >> 8) & 0xff } == 0)

        let run = try ExecutableRun.run("voipserver", ["--cpu-latency-limit", "-1"], timeoutSeconds: 30)
        #expect(run.exitCode == 64 && run.stderr.contains("--cpu-latency-limit"), "\(run.stderr)")
    }

    @Test("the server's threads are named for top -H: loops, store writer, checkpointer")
    func threadNames() throws {
        let server = try ServerProcess(["--workers", "2"])  // the SQLite store, in a fresh directory
        let names = namedThreads(of: server.process.pid).map(\.name)
        for expected in ["vs-loop-0", "vs-loop-1", "vs-store", "vs-checkpoint"] {
            #expect(names.contains(expected), "\(names)")
        }
        #expect(server.terminate().map { ($0 >> 8) & 0xff } == 0)
    }

    @Test("--loop-cpus keeps each loop thread on its CPU; a CPU the machine lacks stops the start")
    func loopCPUs() throws {
        let lastCPU = CPUList.configuredCount - 1
        let server = try ServerProcess(["--loop-cpus", "\(lastCPU),0", "--workers", "3", "--store", "memory"])
        // Loop i on the i-th CPU of the list, wrapping: 0 → last, 1 → 0, 2 → last again.
        let allowed = Self.threadCPUs(of: server.process.pid).filter { $0.key.hasPrefix("vs-loop-") }
        #expect(allowed == ["vs-loop-0": "\(lastCPU)", "vs-loop-1": "0", "vs-loop-2": "\(lastCPU)"], "\(allowed)")
        #expect(server.log.contains("loop_cpus=\(lastCPU),0,\(lastCPU)"), "\(server.log)")
        let client = try RawSocket(port: server.port)
        try client.send(.hello(Hello(userID: "alice", deviceID: "phone")))
        guard case .welcome? = try client.next() else { Issue.record("no WELCOME"); return }
        #expect(server.terminate().map { ($0 >> 8) & 0xff } == 0)

        let missing = try ExecutableRun.run("voipserver", [
            "--listen", "127.0.0.1:0", "--store", "memory", "--loop-cpus", "\(CPUList.configuredCount)",
        ], timeoutSeconds: 30)
        #expect(missing.exitCode == 70 && missing.stderr.contains("there is no CPU \(CPUList.configuredCount)"), "\(missing.stderr)")
        let malformed = try ExecutableRun.run("voipserver", ["--loop-cpus", "1-"], timeoutSeconds: 30)
        #expect(malformed.exitCode == 64 && malformed.stderr.contains("--loop-cpus"), "\(malformed.stderr)")
    }

    @Test("by default, with the SQLite store and a CPU to spare, the loop has the first CPU and the store's threads the others")
    func automaticThreadPlacement() throws {
        let allowed = CPUList.allowed()  // the child inherits the test process's mask
        // ServerProcess turns placement off unless told: this is what a user's server does.
        let server = try ServerProcess(["--thread-placement", "auto", "--workers", "1", "--admin-listen", "127.0.0.1:0"])
        let threads = Self.threadCPUs(of: server.process.pid)
        let line = server.log.split(separator: "\n").first { $0.contains("event=thread_placement ") } ?? ""
        let metrics = try HTTPRequest.send("GET", port: try #require(ServiceDeploymentTests.adminPort(in: server.log)), "/metrics").text
        if allowed.count >= 2 {
            let rest = CPUList.format(Array(allowed.dropFirst()))
            #expect(threads["vs-loop-0"] == "\(allowed[0])", "\(threads)")
            #expect(threads["vs-store"] == rest && threads["vs-checkpoint"] == rest, "\(threads)")
            #expect(line.contains(" placement=auto threads=vs-loop-0:\(allowed[0]),vs-store:\(rest),vs-checkpoint:\(rest) "), "\(line)")
            #expect(metrics.contains("voipserver_thread_cpus{thread=\"vs-loop-0\",cpus=\"\(allowed[0])\",placement=\"auto\"} 1"), "\(metrics)")
            #expect(metrics.contains("voipserver_thread_cpus{thread=\"vs-store\",cpus=\"\(rest)\",placement=\"auto\"} 1"), "\(metrics)")
        } else {
            // One CPU: nothing to spare, every thread stays where the process may run.
            #expect(threads["vs-loop-0"] == CPUList.format(allowed), "\(threads)")
            #expect(line.contains(" placement=none "), "\(line)")
        }
        #expect(server.terminate().map { ($0 >> 8) & 0xff } == 0)

        // Off: every thread keeps the process's mask.
        let unplaced = try ServerProcess(["--thread-placement", "off", "--workers", "1"])
        let all = CPUList.format(allowed)
        let names = Self.threadCPUs(of: unplaced.process.pid)
        #expect(["vs-loop-0", "vs-store", "vs-checkpoint"].allSatisfy { names[$0] == all }, "\(names)")
        #expect(unplaced.log.contains("event=thread_placement placement=off "), "\(unplaced.log)")
        let bad = try ExecutableRun.run("voipserver", ["--thread-placement", "sometimes"], timeoutSeconds: 30)
        #expect(bad.exitCode == 64 && bad.stderr.contains("--thread-placement must be auto or off"), "\(bad.stderr)")
    }

    /// Each named thread of process `pid` and the CPUs it may run on, as the kernel says
    /// (`/proc/PID/task/TID/comm` and the `Cpus_allowed_list` of its `status`).
    static func threadCPUs(of pid: pid_t) -> [String: String] {
        var cpus: [String: String] = [:]
        for (tid, name) in namedThreads(of: pid) {
            let status = readTextFile("/proc/\(pid)/task/\(tid)/status") ?? ""
            let line = status.split(separator: "\n").first { $0.hasPrefix("Cpus_allowed_list:") }
            if !name.isEmpty, let line { cpus[name] = line.split(separator: "\t").last.map(String.init) }
        }
        return cpus
    }

    @Test("a configuration file is honoured")
    func configurationFile() throws {
        let path = "/tmp/voipserver-test-\(UInt32.random(in: 0...UInt32.max)).conf"
        #expect(writeFile(path, "keepalive = 1200\nworkers = 1\n"))
        defer { removeFile(path) }
        let server = try ServerProcess(["--config", path])
        let client = try RawSocket(port: server.port)
        try client.send(.hello(Hello(userID: "alice", deviceID: "phone")))
        guard case .welcome(let welcome)? = try client.next() else { Issue.record("no WELCOME"); return }
        #expect(welcome.keepAliveSeconds == 1200)
    }
}

/// A minimal client for subprocess servers (TestClient with no server object).
typealias RawSocket = TestClient

@Suite("voipserver statistics line")
struct StatisticsLogTests {
    @Test("a stats line with the counters is logged every --stats-interval")
    func statsLine() throws {
        let server = try ServerProcess(["--stats-interval", "1", "--store", "memory", "--tick", "0.05"])
        let client = try RawSocket(port: server.port)
        try client.send(.hello(Hello(userID: "alice", deviceID: "phone")))
        guard case .welcome? = try client.next() else { Issue.record("no WELCOME"); return }
        let deadline = SystemClock().now() + .seconds(20)
        while !server.log.contains("event=stats connections=1 established=1 handshakes=1") {
            guard SystemClock().now() < deadline else {
                Issue.record("no stats line: \(server.log)")
                return
            }
            usleep(20_000)
        }
    }
}

/// What the descriptors of process `pid` refer to (targets of /proc/PID/fd/*).
private func openFiles(of pid: pid_t) -> [String] {
    guard let directory = opendir("/proc/\(pid)/fd") else { return [] }
    defer { closedir(directory) }
    var targets: [String] = []
    while let entry = readdir(directory) {
        let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
        guard name != "." && name != ".." else { continue }
        var buffer = [CChar](repeating: 0, count: 4096)
        let length = readlink("/proc/\(pid)/fd/\(name)", &buffer, buffer.count - 1)
        if length > 0 { targets.append(String(decoding: buffer[..<length].map { UInt8(bitPattern: $0) }, as: UTF8.self)) }
    }
    return targets
}
