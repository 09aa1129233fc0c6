import Foundation
import Synchronization
import SignalingProtocol
@testable import SignalingServer
import SignalingSupport
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// `--loop-realtime`: the loops under `SCHED_FIFO` while they keep up, at the normal policy
/// at start, through a ramp of connections, while a loop is saturated and while the
/// hypervisor steals; `auto` (the default) only where the process may.
@Suite("The event loops at a real-time priority while they keep up")
struct LoopRealtimeTests {
    let start = Instant(nanoseconds: 1_000_000_000)

    @Test("the loops rise only after a whole second with no ramp and no saturated loop, and drop back at the first look that finds either")
    func supervisionRisesAfterACalmSecond() {
        var supervision = LoopRealtimeSupervision()
        #expect(supervision.observe(now: start, ramping: false, busiestLoopShare: 0.2) == nil, "calm from here")
        #expect(supervision.observe(now: start + .milliseconds(999), ramping: false, busiestLoopShare: 0.5) == nil)
        #expect(supervision.observe(now: start + .seconds(1), ramping: false, busiestLoopShare: 0.89) == .raise)
        #expect(supervision.realtime)
        #expect(supervision.observe(now: start + .seconds(2), ramping: false, busiestLoopShare: 0) == nil, "already there")

        #expect(supervision.observe(now: start + .seconds(3), ramping: true, busiestLoopShare: 0) == .lower(.ramp))
        #expect(!supervision.realtime)
        #expect(supervision.observe(now: start + .seconds(3) + .milliseconds(250), ramping: true, busiestLoopShare: 0) == nil)
        // The calm second counts from the first look without the ramp.
        #expect(supervision.observe(now: start + .seconds(4), ramping: false, busiestLoopShare: 0) == nil)
        #expect(supervision.observe(now: start + .seconds(4) + .milliseconds(500), ramping: false, busiestLoopShare: 0.95) == nil, "saturated: the count restarts")
        #expect(supervision.observe(now: start + .seconds(5), ramping: false, busiestLoopShare: 0) == nil)
        #expect(supervision.observe(now: start + .seconds(5) + .milliseconds(999), ramping: false, busiestLoopShare: 0) == nil)
        #expect(supervision.observe(now: start + .seconds(6), ramping: false, busiestLoopShare: 0) == .raise)

        #expect(supervision.observe(now: start + .seconds(7), ramping: false, busiestLoopShare: 0.9) == .lower(.saturated))
        #expect(supervision.observe(now: start + .seconds(7), ramping: true, busiestLoopShare: 1) == nil, "already down")
    }

    @Test("the loops drop back when the hypervisor steals 1 % of the host's CPU time or more, and rise again only after a calm minute without")
    func supervisionGivesWayToSteal() {
        var supervision = LoopRealtimeSupervision()
        #expect(supervision.observe(now: start, ramping: false, busiestLoopShare: 0.3, stolenShare: 0.009) == nil)
        #expect(supervision.observe(now: start + .seconds(1), ramping: false, busiestLoopShare: 0.3, stolenShare: 0.009) == .raise)
        #expect(supervision.observe(now: start + .seconds(2), ramping: false, busiestLoopShare: 0.3, stolenShare: 0.01) == .lower(.steal))
        #expect(supervision.observe(now: start + .seconds(3), ramping: false, busiestLoopShare: 0.3, stolenShare: 0.05) == nil, "already down")
        // Calm from 4 s: a second is not enough after steal, a minute is.
        #expect(supervision.observe(now: start + .seconds(4), ramping: false, busiestLoopShare: 0.3, stolenShare: 0.001) == nil)
        #expect(supervision.observe(now: start + .seconds(5), ramping: false, busiestLoopShare: 0.3, stolenShare: 0.001) == nil)
        #expect(supervision.observe(now: start + .seconds(63), ramping: false, busiestLoopShare: 0.3, stolenShare: 0) == nil)
        // Steal again within the minute: the minute starts over.
        #expect(supervision.observe(now: start + .seconds(63) + .milliseconds(500), ramping: false, busiestLoopShare: 0.3, stolenShare: 0.02) == nil)
        #expect(supervision.observe(now: start + .seconds(64), ramping: false, busiestLoopShare: 0.3, stolenShare: 0) == nil)
        #expect(supervision.observe(now: start + .seconds(123) + .milliseconds(999), ramping: false, busiestLoopShare: 0.3, stolenShare: 0) == nil)
        #expect(supervision.observe(now: start + .seconds(124), ramping: false, busiestLoopShare: 0.3, stolenShare: 0) == .raise)
        // Up again, a ramp lowers for a second's calm as before.
        #expect(supervision.observe(now: start + .seconds(125), ramping: true, busiestLoopShare: 0.3, stolenShare: 0) == .lower(.ramp))
        #expect(supervision.observe(now: start + .seconds(126), ramping: false, busiestLoopShare: 0.3, stolenShare: 0) == nil)
        #expect(supervision.observe(now: start + .seconds(127), ramping: false, busiestLoopShare: 0.3, stolenShare: 0) == .raise)
        // A ramp counts first: the reason is the ramp, whatever the host steals; the steal
        // still asks for the calm minute.
        #expect(supervision.observe(now: start + .seconds(128), ramping: true, busiestLoopShare: 0.3, stolenShare: 0.5) == .lower(.ramp))
        #expect(supervision.observe(now: start + .seconds(129), ramping: false, busiestLoopShare: 0.3, stolenShare: 0) == nil)
        #expect(supervision.observe(now: start + .seconds(130), ramping: false, busiestLoopShare: 0.3, stolenShare: 0) == nil)
        #expect(supervision.observe(now: start + .seconds(189), ramping: false, busiestLoopShare: 0.3, stolenShare: 0) == .raise)
    }

    @Test("the host's stolen time is read from /proc/stat's cpu line, its share taken between two readings")
    func hostCPUTime() throws {
        let directory = try TemporaryDirectory()
        let path = directory.file("stat")
        try "cpu  100 5 50 800 10 3 2 30 0 0\ncpu0 50 2 25 400 5 1 1 15 0 0\nintr 12345 0 1\n".write(toFile: path, atomically: true, encoding: .utf8)
        let first = try #require(HostCPUTime.read(path))
        #expect(first == HostCPUTime(user: 100, nice: 5, system: 50, idle: 800, iowait: 10, irq: 3, softirq: 2, steal: 30))
        #expect(first.total == 1_000)
        #expect(HostCPUTime(idle: 1_920, steal: 80).stolenShare(since: first) == 0.05)
        #expect(first.stolenShare(since: first) == 0, "no time passed")
        #expect(HostCPUTime.read(directory.file("missing")) == nil)
        try "intr 1 2 3\n".write(toFile: path, atomically: true, encoding: .utf8)
        #expect(HostCPUTime.read(path) == nil, "no cpu line first")
        #expect(HostCPUTime.read(HostCPUTime.path) != nil, "this host's /proc/stat")
    }

    @Test("a ramp is 200 handshakes a second or more since the previous look, judged again only once the clock has moved")
    func connectionRamp() {
        var ramp = ConnectionRamp()
        #expect(ramp.observe(handshakes: 0, now: start) == false, "the first look only notes the count")
        #expect(ramp.observe(handshakes: 50, now: start + .milliseconds(250)) == true, "200 a second")
        #expect(ramp.observe(handshakes: 60, now: start + .milliseconds(250)) == true, "the clock stood still: the answer stays")
        #expect(ramp.observe(handshakes: 99, now: start + .milliseconds(500)) == false, "49 in 250 ms: 196 a second")
        #expect(ramp.observe(handshakes: 99, now: start + .seconds(10)) == false)
    }

    @Test("auto is the default of the library and of voipserver; off, 0 and a priority of 1-99 are taken, anything else refused, and a priority with --busy-poll")
    func option() throws {
        #expect(ServerConfiguration().loopRealtime == .auto)
        #expect(try ServerOptions.configuration(from: []).0.loopRealtime == .auto)
        #expect(try ServerOptions.configuration(from: ["--loop-realtime", "off"]).0.loopRealtime == .off)
        #expect(try ServerOptions.configuration(from: ["--loop-realtime", "0"]).0.loopRealtime == .off)
        #expect(try ServerOptions.configuration(from: ["--loop-realtime", "2"]).0.loopRealtime == .priority(2))
        #expect(try ServerOptions.configuration(from: ["--loop-realtime", "auto", "--busy-poll", "50"]).0.busyPoll == .microseconds(50))
        for refused in [["100"], ["-1"], ["fast"], ["1", "--busy-poll", "50"]] {
            #expect(throws: UsageError.self) { try ServerOptions.configuration(from: ["--loop-realtime"] + refused) }
        }
        #expect(throws: ServerError.self) {
            try TestServer(workers: 1) { $0.loopRealtime = .priority(1); $0.busyPoll = .microseconds(50) }
        }
        // auto with a polling loop: the normal policy, and the start-up line says why.
        let log = LogFile()
        let polling = try TestServer(workers: 1, logger: log.logger) { $0.loopRealtime = .auto; $0.busyPoll = .microseconds(50) }
        #expect(polling.server.loopRealtimeChanges == nil)
        #expect(log.lines("loop_realtime").first?.contains("--busy-poll") == true)
        #expect(log.lines("listening").first?.contains("loop_realtime=off") == true)
    }

    @Test(.enabled(if: getuid() == 0, "needs CAP_SYS_NICE"))
    func loopsRiseAfterACalmSecondAndGiveWayToARamp() throws {
        let log = LogFile()
        let server = try TestServer(workers: 2, logger: log.logger) { $0.loopRealtime = .priority(2) }
        #expect(log.lines("listening").first?.contains("loop_realtime=2") == true)
        #expect(server.server.loopThreadRealtimePriorities == [0, 0], "the normal policy at start")
        // The calm second counts from loop 0's first tick with the threads in its hands.
        try server.advance(by: .zero)
        try server.advance(by: .milliseconds(500))
        #expect(server.server.loopThreadRealtimePriorities == [0, 0], "not yet a calm second")
        try server.advance(by: .milliseconds(600))
        #expect(server.server.loopThreadRealtimePriorities == [2, 2])
        let (alice, _) = try server.connect(user: "alice")
        let (bob, _) = try server.connect(user: "bob")
        #expect(try alice.request(1, .messageSend(OutgoingMessage(messageID: "m1", recipient: "bob", contentType: "t", body: [1]))).isOK)
        #expect(try Self.isMessage(bob.nextEvent().event))

        // 80 handshakes within 300 ms of the clock (with alice's and bob's: 273 a second).
        var devices: [TestClient] = []
        for index in 0..<80 { devices.append(try server.connect(user: "ramp\(index)").0) }
        try server.advance(by: .milliseconds(300))
        #expect(server.server.loopThreadRealtimePriorities == [0, 0], "a ramp: back to the normal policy")
        #expect(server.server.loopRealtimeChanges.map { $0.raises == 1 && $0.loweredForRamp == 1 } == true)
        try server.advance(by: .milliseconds(600))
        try server.advance(by: .milliseconds(600))
        #expect(server.server.loopThreadRealtimePriorities == [0, 0], "calm for 600 ms only: the first look after the ramp starts the count")
        try server.advance(by: .milliseconds(500))
        #expect(server.server.loopThreadRealtimePriorities == [2, 2])
        #expect(server.server.loopRealtimeChanges.map { $0.raises == 2 } == true)
        #expect(try bob.request(1, .messageSend(OutgoingMessage(messageID: "m2", recipient: "alice", contentType: "t", body: [2]))).isOK)
        #expect(try Self.isMessage(alice.nextEvent().event))
        #expect(devices.count == 80)
    }

    @Test(.enabled(if: getuid() == 0, "needs CAP_SYS_NICE"))
    func loopsGiveWayWhileTheHypervisorSteals() throws {
        let directory = try TemporaryDirectory()
        let stat = directory.file("stat")
        func host(total: Int, steal: Int) throws {
            try "cpu  \(total - steal) 0 0 0 0 0 0 \(steal) 0 0\n".write(toFile: stat, atomically: true, encoding: .utf8)
        }
        try host(total: 1_000, steal: 0)
        let server = try TestServer(workers: 2) {
            $0.loopRealtime = .priority(2)
            $0.hostCPUTimePath = stat
        }
        try server.advance(by: .zero)
        try server.advance(by: .milliseconds(1_100))
        #expect(server.server.loopThreadRealtimePriorities == [2, 2], "a calm second, no steal")
        // 5 % of the host's time stolen since: judged once a second of real time has passed
        // since the first reading.
        try host(total: 2_000, steal: 50)
        let deadline = SystemClock().now() + .seconds(10)
        while server.server.loopThreadRealtimePriorities != [0, 0] && SystemClock().now() < deadline {
            try server.advance(by: .milliseconds(250))
            usleep(50_000)
        }
        #expect(server.server.loopThreadRealtimePriorities == [0, 0], "the hypervisor steals: back to the normal policy")
        #expect(server.server.loopRealtimeChanges.map { $0.raises == 1 && $0.loweredForSteal == 1 } == true)
        // No more steal: up again after a calm minute of the server's clock, which starts
        // once the next window of real time has been judged.
        try host(total: 3_000, steal: 50)
        var calm: Duration = .zero
        while server.server.loopThreadRealtimePriorities != [2, 2] && SystemClock().now() < deadline + .seconds(20) {
            try server.advance(by: .seconds(5))
            calm += .seconds(5)
            usleep(50_000)
        }
        #expect(server.server.loopThreadRealtimePriorities == [2, 2])
        #expect(calm >= LoopRealtimeSupervision.stealCalm, "up after \(calm) without steal")
        #expect(server.server.loopRealtimeChanges.map { $0.raises == 2 } == true)
    }

    @Test(.enabled(if: getuid() == 0, "needs CAP_SYS_NICE"))
    func voipserverByDefaultRunsItsLoopsUnderSCHEDFIFOOnceCalm() throws {
        // The server reads a host that never steals: a /proc/stat of its own, bound over the
        // real one in a mount namespace of its own. The real host's steal (a busy CI VM
        // steals more than 1 % at times) would keep the loops at the normal policy for a
        // minute after each window that saw it, rightly (`supervisionGivesWayToSteal`).
        let directory = try TemporaryDirectory()
        let stat = directory.file("stat")
        try "cpu  1000 0 0 0 0 0 0 0 0 0\n".write(toFile: stat, atomically: true, encoding: .utf8)
        let server = try ServerProcess(
            ["--store", "memory", "--workers", "2"],
            through: ["/usr/bin/unshare", "--mount", "--propagation", "private", "/bin/sh", "-c",
                "mount --bind \"$0\" /proc/stat && exec \"$@\"", stat])
        let log = server.log
        #expect(log.contains("event=loop_realtime priority=1"), "\(log)")
        #expect(log.contains("loop_realtime=1"), "\(log)")
        // Real time, unlike the tests above: a second without a ramp, then the next tick.
        let deadline = SystemClock().now() + .seconds(20)
        while Self.loopPolicies(pid: server.process.pid) != [SCHED_FIFO, SCHED_FIFO] {
            #expect(SystemClock().now() < deadline, "the loops did not rise: \(Self.loopPolicies(pid: server.process.pid))")
            guard SystemClock().now() < deadline else { return }
            usleep(20_000)
        }
        let client = try TestClient(port: server.port)
        _ = try client.hello(user: "alice", device: "d1")
    }

    @Test(.enabled(if: getuid() == 0, "drops CAP_SYS_NICE from root"))
    func withoutPermissionAutoSaysSoAndKeepsTheNormalPolicy() throws {
        // Root without CAP_SYS_NICE and with an RLIMIT_RTPRIO of 0 may not use SCHED_FIFO.
        let server = try ServerProcess(
            ["--store", "memory", "--workers", "2"],
            through: ["/usr/bin/prlimit", "--rtprio=0:0", "/usr/bin/setpriv", "--bounding-set=-sys_nice", "--inh-caps=-sys_nice"])
        let log = server.log
        #expect(log.contains("event=loop_realtime priority=off detail=\"not permitted"), "\(log)")
        #expect(log.contains("loop_realtime=off"), "\(log)")
        #expect(!log.contains("loop_realtime_ignored"), "auto warns of nothing: \(log)")
        #expect(Self.loopPolicies(pid: server.process.pid) == [SCHED_OTHER, SCHED_OTHER])
        // A priority asked for outright and refused is a warning.
        let explicit = try ServerProcess(
            ["--store", "memory", "--loop-realtime", "3"],
            through: ["/usr/bin/prlimit", "--rtprio=0:0", "/usr/bin/setpriv", "--bounding-set=-sys_nice", "--inh-caps=-sys_nice"])
        let explicitLog = explicit.log
        #expect(explicitLog.contains("event=loop_realtime_ignored"), "\(explicitLog)")
    }

    @Test("a thread's CPU time grows while it runs and not while it sleeps")
    func threadCPUTime() throws {
        let stop = Atomic<Bool>(false)
        let spinner = JoinableThread(name: "vs-test-spin") { while !stop.load(ordering: .relaxed) {} }
        let sleeper = JoinableThread(name: "vs-test-sleep") { while !stop.load(ordering: .relaxed) { usleep(1_000) } }
        defer {
            stop.store(true, ordering: .relaxed)
            spinner.join()
            sleeper.join()
        }
        let deadline = SystemClock().now() + .seconds(20)
        while (spinner.cpuTime ?? .zero) < .milliseconds(50) {
            guard SystemClock().now() < deadline else { Issue.record("the spinning thread's CPU time stayed at \(String(describing: spinner.cpuTime))"); return }
            usleep(5_000)
        }
        let sleeping = try #require(sleeper.cpuTime)
        #expect(sleeping < .milliseconds(25), "a thread asleep in usleep uses little CPU: \(sleeping)")
    }

    static func isMessage(_ event: Event) -> Bool {
        if case .message = event { return true } else { return false }
    }

    /// The scheduling policy of each of the process's `vs-loop-*` threads, by name.
    static func loopPolicies(pid: pid_t) -> [Int32] {
        namedThreads(of: pid).filter { $0.name.hasPrefix("vs-loop") }.sorted { $0.name < $1.name }.map { sched_getscheduler($0.tid) }
    }
}
