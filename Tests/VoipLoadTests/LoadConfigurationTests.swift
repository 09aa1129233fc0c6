import SignalingSupport
import Testing
@testable import VoipLoadKit

@Suite struct LoadConfigurationTests {
    @Test func defaultsAndAutomaticWorkers() throws {
        let (config, help) = try LoadConfiguration.parse([])
        #expect(!help)
        #expect(config.server == "127.0.0.1:7443" && config.idleDevices == 1000 && config.events == 1000)
        #expect(config.effectiveWorkers == 2 && config.probePriority == .normal)
        let (big, _) = try LoadConfiguration.parse(["--devices", "30000", "--source-addresses", "100"])
        #expect(big.effectiveWorkers == 3)
    }

    @Test func everyOptionIsRead() throws {
        let (config, _) = try LoadConfiguration.parse([
            "--server", "127.0.0.9:9000", "--devices", "5000", "--workers", "4", "--connect-rate", "2500",
            "--max-in-flight", "64", "--source-addresses", "200", "--auth-secret", "k", "--keepalive", "900",
            "--events", "10", "--rate", "50", "--event-mix", "call", "--payload-bytes", "32", "--loss-deadline", "2",
            "--probe-priority", "realtime", "--call-answer", "accept", "--push-users", "16",
            "--fanout-devices", "100", "--fanout-users", "4", "--fanout-seconds", "3", "--fanout-window", "8", "--storm", "restart",
            "--storm-deadline", "30", "--server-bin", "/bin/true", "--server-log", "/tmp/s.log", "--json", "--quiet",
            "--", "--workers", "2",
        ])
        #expect(config.serverEndpoint.address == (127 << 24 | 9) && config.serverEndpoint.port == 9000)
        #expect(config.workers == 4 && config.connectRate == 2500 && config.maxInFlight == 64)
        #expect(config.authSecret == "k" && config.keepAlive == 900 && config.mix == .call && config.probePriority == .realtime)
        #expect(config.fanoutDevices == 100 && config.fanoutUsers == 4 && config.fanoutWindow == 8 && config.storm == .restart)
        #expect(config.serverBinary == "/bin/true" && config.serverArguments == ["--workers", "2"])
        #expect(config.json && !config.progress)
        #expect(config.callAnswer == .accept && config.pushUsers == 16)
        let (defaults, _) = try LoadConfiguration.parse([])
        #expect(defaults.callAnswer == .reject && defaults.pushUsers == 0)
    }

    @Test func serverListInOrder() throws {
        let (config, _) = try LoadConfiguration.parse(["--server", "127.0.0.1:9000,127.0.0.2:9001", "--events", "0"])
        #expect(config.serverEndpoints == [LoopbackEndpoint((127 << 24 | 1, 9000)), LoopbackEndpoint((127 << 24 | 2, 9001))])
        #expect(config.serverEndpoint.address == (127 << 24 | 1) && config.serverEndpoint.port == 9000)
    }

    @Test(arguments: [
        (["--devices", "0"], "--devices must be between"),
        (["--server", "10.0.0.1:7443"], "loopback"),
        (["--server", "nohost"], "A.B.C.D:PORT"),
        (["--keepalive", "60"], "at least 600"),
        (["--storm", "restart"], "needs --server-bin"),
        (["--storm", "sometimes"], "none, drop or restart"),
        (["--event-mix", "video"], "message, call or both"),
        (["--probe-priority", "high"], "normal or realtime"),
        (["--call-answer", "maybe"], "reject or accept"),
        (["--devices", "30000", "--workers", "2"], "use --workers 3"),
        (["--fanout-devices", "10", "--fanout-users", "4"], "must divide --fanout-devices"),
        (["--devices", "50000", "--source-addresses", "1", "--workers", "5"], "raise --source-addresses"),
        (["--server-pid", "12", "--server-bin", "/bin/true"], "exclude each other"),
        (["--server", "127.0.0.1:1,127.0.0.1:2", "--server-pid", "12"], "excludes --server-bin and --server-pid"),
        (["--server", "127.0.0.1:1,127.0.0.1:2", "--server-bin", "/bin/true"], "excludes --server-bin and --server-pid"),
        (["--server", "127.0.0.1:1,"], "A.B.C.D:PORT[,A.B.C.D:PORT...]"),
        (["--server", "127.0.0.1:1,10.0.0.1:2"], "loopback"),
        (["stray"], "unexpected argument"),
        (["--bogus"], "unknown option"),
    ])
    func badUsageIsExplained(arguments: [String], message: String) {
        do {
            _ = try LoadConfiguration.parse(arguments)
            Issue.record("\(arguments) was accepted")
        } catch {
            #expect(error.message.contains(message), "\(error.message)")
        }
    }
}
