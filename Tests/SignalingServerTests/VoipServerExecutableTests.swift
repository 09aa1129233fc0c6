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
        let names = listDirectory("/proc/\(server.process.pid)/task").compactMap { task in
            readTextFile("/proc/\(server.process.pid)/task/\(task)/comm")?.split(separator: "\n").first.map(String.init)
        }
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
        var allowed: [String: String] = [:]
        for task in listDirectory("/proc/\(server.process.pid)/task") {
            let name = readTextFile("/proc/\(server.process.pid)/task/\(task)/comm")?.split(separator: "\n").first.map(String.init) ?? ""
            let status = readTextFile("/proc/\(server.process.pid)/task/\(task)/status") ?? ""
            let line = status.split(separator: "\n").first { $0.hasPrefix("Cpus_allowed_list:") }
            if name.hasPrefix("vs-loop-"), let line { allowed[name] = line.split(separator: "\t").last.map(String.init) }
        }
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
