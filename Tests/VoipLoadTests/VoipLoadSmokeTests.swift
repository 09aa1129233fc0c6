import CLinuxShims
import Foundation
import TestSupport
import Testing
import SignalingSupport
@testable import VoipLoadKit

/// The load tool end to end: real `voipload` and `voipserver` processes on loopback.
/// A few hundred connections and events, so it takes seconds; the big runs are
/// benchmarks (Tools/bench-idle-connections), not tests.
@Suite(.serialized) struct VoipLoadSmokeTests {
    @Test func holdsDevicesAndLosesNoEvent() throws {
        let data = try TemporaryDirectory("voipload-smoke")
        // Devices present device tokens (docs/AUTH.md) minted with the server's key file.
        let keyFile = data.file("keys")
        try "smoke \(String(repeating: "5", count: 64))\n".write(toFile: keyFile, atomically: false, encoding: .utf8)
        let run = try ExecutableRun.run("voipload", [
            "--server-bin", ExecutableRun.path(of: "voipserver"), "--server", "127.0.0.1:0",
            "--devices", "300", "--source-addresses", "8", "--auth-key-file", keyFile,
            "--events", "300", "--rate", "2000", "--fanout-devices", "20", "--fanout-seconds", "0.3",
            "--storm", "drop", "--settle", "0.2", "--loss-deadline", "10", "--json", "--quiet",
            "--", "--log-level", "warn", "--workers", "1", "--data-dir", data.path,
        ], timeoutSeconds: 120)
        #expect(run.exitCode == 0, "stderr: \(run.stderr)")
        let report = try JSONDecoder().decode(LoadReport.self, from: Data(run.stdout.utf8))
        #expect(report.passed, "\(report.problems)")
        #expect(report.connections.connected == 300 && report.connections.failed == 0)
        let push = try #require(report.push)
        #expect(push.sent == 300 && push.received == 300 && push.lost == 0 && push.refused == 0)
        #expect(push.messageLatency.count == 150 && push.callLatency.count == 150)
        #expect(push.latency.p50 > 0 && push.latency.p50 <= push.latency.p99 && push.latency.p99 <= push.latency.max)
        // Arrival is the kernel's receive timestamp, which every loopback read carries, and
        // it precedes the read: no percentile of arrival can exceed the read's.
        let read = try #require(push.readLatency)
        #expect(push.unstampedEvents == 0 && read.count == 300)
        #expect(push.latency.p50 <= read.p50 && push.latency.p99 <= read.p99 && push.latency.max <= read.max)
        let fanout = try #require(report.fanout)
        #expect(fanout.messages > 0 && fanout.lost == 0)
        #expect(fanout.delivered == fanout.messages * 20 && fanout.receipts == fanout.delivered)
        let storm = try #require(report.storm)
        #expect(storm.recovered && storm.handshakes >= 300 && storm.resumed >= 300)
        #expect(report.memory.serverRSSAfter != nil && report.memory.serverBytesPerConnection != nil)
        #expect(run.stderr.contains("result       PASS"), "the human summary goes to stderr with --json")
    }

    @Test("a fan-out to several users, over two server loops, delivers every copy and receipt")
    func fanoutToSeveralUsers() throws {
        let data = try TemporaryDirectory("voipload-fanout-users")
        let run = try ExecutableRun.run("voipload", [
            "--server-bin", ExecutableRun.path(of: "voipserver"), "--server", "127.0.0.1:0", "--auth-secret", "s",
            "--devices", "10", "--events", "0", "--fanout-devices", "24", "--fanout-users", "6", "--fanout-seconds", "0.3",
            "--loss-deadline", "10", "--json", "--quiet",
            "--", "--log-level", "warn", "--workers", "2", "--store", "memory", "--data-dir", data.path,
        ], timeoutSeconds: 120)
        #expect(run.exitCode == 0, "stderr: \(run.stderr)")
        let report = try JSONDecoder().decode(LoadReport.self, from: Data(run.stdout.utf8))
        #expect(report.passed, "\(report.problems)")
        let fanout = try #require(report.fanout)
        #expect(fanout.users == 6 && fanout.messages > 0 && fanout.lost == 0)
        // Each message goes to one user's 4 devices.
        #expect(fanout.delivered == fanout.messages * 4 && fanout.receipts == fanout.delivered)
    }

    @Test func holdsDevicesOverTLSAndResumesAfterADrop() throws {
        let data = try TemporaryDirectory("voipload-tls")
        let certificates = try TestCertificates()
        let run = try ExecutableRun.run("voipload", [
            "--server-bin", ExecutableRun.path(of: "voipserver"), "--server", "127.0.0.1:0", "--tls", "--ca-file", certificates.caFile,
            "--devices", "200", "--source-addresses", "4", "--events", "200", "--rate", "2000",
            "--storm", "drop", "--settle", "0.2", "--loss-deadline", "10", "--json", "--quiet",
            "--", "--tls-cert", certificates.serverChainFile, "--tls-key", certificates.serverKeyFile,
            "--log-level", "warn", "--workers", "1", "--data-dir", data.path,
        ], timeoutSeconds: 120)
        #expect(run.exitCode == 0, "stderr: \(run.stderr)")
        let report = try JSONDecoder().decode(LoadReport.self, from: Data(run.stdout.utf8))
        #expect(report.passed, "\(report.problems)")
        #expect(report.connections.connected == 200)
        let push = try #require(report.push)
        #expect(push.received == 200 && push.lost == 0)
        // The arrival stamp is peeked before OpenSSL reads, so TLS is measured like plain TCP.
        #expect(push.unstampedEvents == 0)
        let tls = try #require(report.tls)
        // Every idle device and each worker's two senders did one full handshake; the storm's
        // reconnects offered their tickets and resumed.
        #expect(tls.fullHandshakes == 200 + 2 * UInt64(report.setup.workers), "\(tls)")
        let storm = try #require(report.storm)
        #expect(storm.recovered && storm.tlsResumedHandshakes == 200 && storm.tlsFullHandshakes == 0, "\(storm)")
        #expect(run.stderr.contains("full +") && run.stderr.contains("resumed handshakes"))
    }

    /// Whether this process may use SCHED_FIFO (root, CAP_SYS_NICE or an RLIMIT_RTPRIO).
    static let realtimeAllowed: Bool = {
        guard voipload_set_realtime(1) == 0 else { return false }
        _ = voipload_set_realtime(0)
        return true
    }()

    @Test(.enabled(if: realtimeAllowed, "needs SCHED_FIFO: root or CAP_SYS_NICE"))
    func realtimeProbesAreReportedAndLoseNothing() throws {
        let data = try TemporaryDirectory("voipload-smoke")
        let run = try ExecutableRun.run("voipload", [
            "--server-bin", ExecutableRun.path(of: "voipserver"), "--server", "127.0.0.1:0",
            "--devices", "100", "--source-addresses", "4", "--events", "200", "--rate", "2000",
            "--probe-priority", "realtime", "--fanout-devices", "10", "--fanout-seconds", "0.2",
            "--settle", "0", "--json", "--quiet",
            "--", "--log-level", "warn", "--workers", "1", "--data-dir", data.path,
        ], timeoutSeconds: 120)
        #expect(run.exitCode == 0, "stderr: \(run.stderr)")
        let report = try JSONDecoder().decode(LoadReport.self, from: Data(run.stdout.utf8))
        let push = try #require(report.push)
        // Every worker confirmed it switched (the coordinator refuses the run otherwise).
        #expect(push.priority == "realtime" && push.sent == 200 && push.received == 200 && push.lost == 0)
        #expect(report.fanout.map { $0.lost == 0 && $0.messages > 0 } == true)
        #expect(run.stderr.contains("workers at SCHED_FIFO"), "\(run.stderr)")
    }

    @Test(.enabled(if: getuid() == 0, "drops CAP_SYS_NICE from root"))
    func realtimeProbesRefusedAreAClearErrorBeforeAnythingRuns() throws {
        // Root without CAP_SYS_NICE and with an RLIMIT_RTPRIO of 0 may not use SCHED_FIFO.
        // The tool says so before it connects anything (no server is even listening).
        let port = try #require(SocketCalls.freeLoopbackPort())
        let run = try ExecutableRun.run("voipload", [
            "--server", "127.0.0.1:\(port)", "--devices", "10", "--probe-priority", "realtime", "--quiet",
        ], through: ["/usr/bin/prlimit", "--rtprio=0:0", "/usr/bin/setpriv", "--bounding-set=-sys_nice", "--inh-caps=-sys_nice"],
           timeoutSeconds: 30)
        #expect(run.exitCode == 1)
        #expect(run.stderr.contains("--probe-priority realtime needs SCHED_FIFO, which was refused (Operation not permitted)"), "\(run.stderr)")
        #expect(!run.stderr.contains("cannot connect"), "\(run.stderr)")
    }

    @Test func missingCredentialsFailEveryDeviceWithTheReason() throws {
        // The server wants credentials and the devices have none: CLOSE unauthorized.
        let data = try TemporaryDirectory("voipload-smoke")
        let run = try ExecutableRun.run("voipload", [
            "--server-bin", ExecutableRun.path(of: "voipserver"), "--server", "127.0.0.1:0",
            "--devices", "20", "--events", "0", "--quiet",
            "--", "--log-level", "error", "--auth-secret", "only-the-server-knows", "--data-dir", data.path,
        ], timeoutSeconds: 60)
        #expect(run.exitCode == 1)
        #expect(run.stderr.contains("unauthorized"), "\(run.stderr)")
    }

    /// Device g dials server g mod n: with the second of two servers down, exactly every
    /// other device fails, and the first server holds the rest.
    @Test func spreadsDevicesOverTheServersOfAList() throws {
        let server = try ServerProcess(["--store", "memory", "--workers", "1"])
        let down = try #require(SocketCalls.freeLoopbackPort())
        let run = try ExecutableRun.run("voipload", [
            "--server", "127.0.0.1:\(server.port),127.0.0.1:\(down)", "--devices", "40", "--source-addresses", "4",
            "--events", "0", "--connect-timeout", "1", "--settle", "0", "--json", "--quiet",
        ], timeoutSeconds: 60)
        let report = try JSONDecoder().decode(LoadReport.self, from: Data(run.stdout.utf8))
        #expect(report.connections.connected == 20 && report.connections.failed == 20, "\(run.stderr)")
        #expect(!report.passed && run.exitCode == 1)
    }

    @Test func unreachableServerIsAClearError() throws {
        let port = try #require(SocketCalls.freeLoopbackPort())
        let run = try ExecutableRun.run("voipload", ["--server", "127.0.0.1:\(port)", "--devices", "10", "--quiet"], timeoutSeconds: 30)
        #expect(run.exitCode == 1)
        #expect(run.stderr.contains("cannot connect to the server at 127.0.0.1:\(port): Connection refused"), "\(run.stderr)")
    }

    @Test func latencyFloorThroughARelayProcess() throws {
        let run = try ExecutableRun.run("voipload", ["floor", "200"], timeoutSeconds: 60)
        #expect(run.exitCode == 0, "\(run.stderr)")
        #expect(run.stdout.contains("two-hop loopback floor") && run.stdout.contains("(200 samples)"), "\(run.stdout)")
        #expect(run.stdout.contains("arrival at the receiving socket") && run.stdout.contains("read by the receiver"), "\(run.stdout)")
        let usage = try ExecutableRun.run("voipload", ["floor", "many"], timeoutSeconds: 30)
        #expect(usage.exitCode == 64 && usage.stderr.contains("voipload floor [SAMPLES]"))
    }

    @Test func badUsageExitsWithUsage() throws {
        let run = try ExecutableRun.run("voipload", ["--devices", "lots"], timeoutSeconds: 30)
        #expect(run.exitCode == 64)
        #expect(run.stderr.contains("--devices expects a whole number") && run.stderr.contains("USAGE"))
        let help = try ExecutableRun.run("voipload", ["--help"], timeoutSeconds: 30)
        #expect(help.exitCode == 0 && help.stdout.contains("--fanout-devices"))
        let table = try ExecutableRun.run("voipload", ["table", "/nonexistent.json"], timeoutSeconds: 30)
        #expect(table.exitCode == 1 && table.stderr.contains("cannot read /nonexistent.json"))
    }
}

/// The calibration probe (Tools/reference-probe) against a real voipserver. Its MQTT side
/// needs Mosquitto, which only `Tools/bench-reference` installs; it is not run here.
@Suite struct ReferenceProbeSmokeTests {
    @Test func voipProbeLosesNothing() throws {
        let server = try ServerProcess(["--store", "memory", "--log-level", "info", "--workers", "1"])
        defer { _ = server.terminate() }
        let run = try ExecutableRun.run("reference-probe", [
            "--protocol", "voip", "--server", "127.0.0.1:\(server.port)", "--subscribers", "50",
            "--events", "200", "--rate", "1000", "--source-addresses", "4", "--settle", "0.1",
            "--server-pid", "\(server.process.pid)",
        ], timeoutSeconds: 60)
        #expect(run.exitCode == 0, "stdout: \(run.stdout)\nstderr: \(run.stderr)")
        let summary = try #require(run.stdout.split(separator: "\n").first { $0.hasPrefix("SUMMARY ") })
        #expect(summary.contains(" subscribers=50 failed=0 "), "\(summary)")
        #expect(summary.contains(" samples=200 ") && summary.contains(" lost=0 "), "\(summary)")
        // Every event is timed twice: its arrival (the kernel's receive timestamp) comes
        // before its read, so no percentile of the first can exceed the second's.
        let fields = Dictionary(uniqueKeysWithValues: summary.split(separator: " ").dropFirst().compactMap { pair -> (String, Double)? in
            let parts = pair.split(separator: "=", maxSplits: 1)
            guard parts.count == 2, let value = Double(parts[1]) else { return nil }
            return (String(parts[0]), value)
        })
        let arrival = try #require(fields["p50_us"]), read = try #require(fields["read_p50_us"])
        #expect(arrival > 0 && arrival <= read, "\(summary)")
        #expect(try #require(fields["p99_us"]) <= (try #require(fields["read_p99_us"])), "\(summary)")
    }

    @Test("--turns: one report per pacing over all its turns, 'ready' then 'done' per turn, nothing after 'end'; message ids never repeat across turns")
    func turnsAddUpPerPacing() throws {
        let files = try TemporaryDirectory("reference-probe-turns")
        let run = try probeInTurns("closed 40\n500 30\n\nclosed 40\nend\nclosed 999\n", files: files)
        #expect(run.exitCode == 0, "stdout: \(run.stdout)\nstderr: \(run.stderr)")
        let summaries = run.stdout.split(separator: "\n").filter { $0.hasPrefix("SUMMARY ") }
        #expect(summaries.count == 2, "\(run.stdout)")
        // The second closed turn's 40 events reached their devices: the server did not take
        // them for retries of the first turn's (a message id is unique over the turns).
        #expect(summaries.first?.contains(" pacing=closed ") == true && summaries.first?.contains(" samples=80 ") == true, "\(summaries)")
        #expect(summaries.last?.contains(" pacing=500 ") == true && summaries.last?.contains(" samples=30 ") == true, "\(summaries)")
        #expect(summaries.allSatisfy { $0.contains(" lost=0 ") }, "\(summaries)")
        #expect(try String(contentsOfFile: files.file("done"), encoding: .utf8) == "ready\ndone\ndone\ndone\n")
    }

    @Test func aTurnThatIsNotClosedOrARateStopsTheProbe() throws {
        let run = try probeInTurns("sometimes 10\n", files: try TemporaryDirectory("reference-probe-turns"))
        #expect(run.exitCode == 2 && run.stderr.contains("a turn's pacing is 'closed' or events/s"), "\(run.stderr)")
    }

    /// reference-probe against a fresh server, its turns read from a file holding `turns`,
    /// `done` written beside it.
    private func probeInTurns(_ turns: String, files: TemporaryDirectory) throws -> ExecutableRun {
        let server = try ServerProcess(["--store", "memory", "--log-level", "info", "--workers", "1"])
        defer { _ = server.terminate() }
        try turns.write(toFile: files.file("go"), atomically: false, encoding: .utf8)
        return try ExecutableRun.run("reference-probe", [
            "--protocol", "voip", "--server", "127.0.0.1:\(server.port)", "--subscribers", "30",
            "--source-addresses", "4", "--settle", "0.1", "--server-pid", "\(server.process.pid)",
            "--turns", files.file("go"), "--turns-done", files.file("done"),
        ], timeoutSeconds: 60)
    }

    @Test func badUsageIsExit64() throws {
        let run = try ExecutableRun.run("reference-probe", ["--protocol", "carrier-pigeon"], timeoutSeconds: 30)
        #expect(run.exitCode == 64, "\(run.stderr)")
    }
}
