import SignalingCrypto
import SignalingProtocol
import SignalingSupport
import SignalingTLS

/// How a reconnect storm is caused.
public enum StormKind: String, Codable, Sendable, CaseIterable {
    case none
    /// Every idle device drops its connection at once and reconnects at once (resume).
    case drop
    /// The server is sent SIGTERM (CLOSE goingAway to all) and started again; needs
    /// --server-bin.
    case restart
}

/// Everything a load run is told, checked.
public struct LoadConfiguration: Sendable, Equatable {
    /// `--server`: one loopback HOST:PORT, or several separated by commas (the nodes of a
    /// cluster: the devices are spread over them, device g on node g mod n).
    public var server = "127.0.0.1:7443"
    /// The servers of `server`, in order (checked by `parse`).
    public var serverEndpoints: [LoopbackEndpoint] {
        server.split(separator: ",").map { LoopbackEndpoint(SocketCalls.parseEndpoint(String($0))!) }
    }
    /// The first server: the one started (`--server-bin`) and measured (`--server-pid`).
    public var serverEndpoint: (address: UInt32, port: UInt16) { SocketCalls.parseEndpoint(String(server.prefix { $0 != "," }))! }
    public var idleDevices = 1000
    /// 0 = automatic: enough processes that none holds more than `connectionsPerWorker`.
    public var workers = 0
    public var connectRate: Double = 0
    public var maxInFlight = 256
    public var sourceAddresses = 64
    public var authSecret: String?
    /// `--auth-key-file`: the server's token key file; devices present tokens signed with
    /// its last key, and a server this tool starts is given the file.
    public var authKeyFile: String?
    public var tokenKey: TokenKey?
    public var keepAlive: UInt32 = 0
    /// `--tls` and its options (the name to check defaults to the host of `--server`);
    /// nil: plain TCP.
    public var tls: TLSClientConfiguration?
    public var connectTimeout: Double = 60
    public var settleSeconds: Double = 2
    public var holdSeconds: Double = 0

    public var events = 1000
    public var rate: Double = 1000
    public var mix: EventMix = .both
    public var callAnswer: CallAnswer = .reject
    public var pushUsers = 0
    public var payloadBytes = 64
    public var lossDeadline: Double = 5
    public var probePriority: ProbePriority = .normal

    public var fanoutDevices = 0
    /// The users the fan-out devices are dealt to; each message goes to one of them in turn.
    public var fanoutUsers = 1
    public var fanoutSeconds: Double = 5
    public var fanoutWindow = 4

    public var storm: StormKind = .none
    public var stormDeadline: Double = 120

    public var serverPID: Int32?
    public var serverBinary: String?
    public var serverArguments: [String] = []
    public var serverLog: String?

    public var json = false
    public var progress = true

    public init() {}

    /// A worker holds at most this many connections, well below the 20,000 descriptors
    /// one process may have on the benchmark machine.
    public static let connectionsPerWorker = 12_000
    /// Each worker also holds a probe sender and a fan-out sender.
    static let sendersPerWorker = 2

    /// The worker count in force: as given, or the automatic choice (at least two, so
    /// that the multi-process path is always the one exercised).
    public var effectiveWorkers: Int {
        if workers > 0 { return workers }
        let connections = idleDevices + fanoutDevices
        return max(2, (connections + Self.connectionsPerWorker - 1) / Self.connectionsPerWorker)
    }

    public static let parser = CommandLineParser(
        command: "voipload",
        usage: "voipload [OPTIONS] [-- SERVER-ARGUMENTS...]\n       voipload table REPORT.json...\n       voipload floor [SAMPLES]",
        summary: """
            Holds many authenticated, idle device connections to a voipserver (spread over \
            loopback source addresses and worker processes) and measures what they cost the \
            server and how fast it still pushes to them: memory per connection, push latency \
            percentiles, handshake rate, fan-out throughput per CPU core, reconnect storms.
            """,
        options: [
            OptionSpec("server", value: "HOST:PORT[,...]", default: "127.0.0.1:7443", help: "Server to load (IPv4 loopback), or the nodes of a cluster separated by commas: device g connects to node g mod n (no --server-bin, --server-pid or --storm restart then)."),
            OptionSpec("devices", value: "N", default: "1000", help: "Idle device connections to hold."),
            OptionSpec("workers", value: "N", default: "auto", help: "Worker processes holding the connections."),
            OptionSpec("connect-rate", value: "N", default: "0 = unlimited", help: "Connection attempts started per second, all workers together."),
            OptionSpec("max-in-flight", value: "N", default: "256", help: "Connects and handshakes in progress at once, per worker."),
            OptionSpec("source-addresses", value: "N", default: "64", help: "Loopback source addresses to spread connections over (127.0.0.2 upward)."),
            OptionSpec("auth-key-file", value: "FILE", help: "Server's token key file (docs/AUTH.md); devices then present device tokens signed with its last key."),
            OptionSpec("auth-secret", value: "SECRET", help: "Server's legacy secret; devices then present hex(HMAC-SHA256(SECRET, user)) credentials."),
        ] + TLSClientConfiguration.commandLineOptions + [
            OptionSpec("keepalive", value: "SECONDS", default: "0 = server's choice", help: "Keep-alive interval requested in HELLO (0 or at least 600)."),
            OptionSpec("connect-timeout", value: "SECONDS", default: "60", help: "A device not connected this long after its first attempt has failed."),
            OptionSpec("settle", value: "SECONDS", default: "2", help: "Wait after the ramp before reading the server's memory."),
            OptionSpec("hold", value: "SECONDS", default: "0", help: "Keep holding the idle connections this long after the measurements."),
            OptionSpec("events", value: "N", default: "1000", help: "Push-latency probes to send (0 skips the latency test)."),
            OptionSpec("rate", value: "N", default: "1000", help: "Probes per second, all workers together."),
            OptionSpec("event-mix", value: "message|call|both", default: "both", help: "Probe kind: MESSAGE_SEND, CALL_INVITE, or alternating."),
            OptionSpec("call-answer", value: "reject|accept", default: "reject", help: "What an idle device does with a call probe: decline it, or ring and accept it (the caller then hangs up)."),
            OptionSpec("push-users", value: "N", default: "0", help: "Users w0...w<N-1>, registered for push beforehand and not connected: a quarter of the probes go to them (push wake-ups; a call is cancelled once accepted), counted apart from the latency probes."),
            OptionSpec("payload-bytes", value: "N", default: "64", help: "Probe body size (at least 16)."),
            OptionSpec("loss-deadline", value: "SECONDS", default: "5", help: "A probe not arrived this long after the last send is lost."),
            OptionSpec("probe-priority", value: "normal|realtime", default: "normal", help: "Scheduling of the workers while probes run: realtime (SCHED_FIFO, needs root) keeps the server's other threads from delaying the tool when both share a CPU."),
            OptionSpec("fanout-devices", value: "N", default: "0", help: "Devices of the fan-out user(s); 0 skips the fan-out test."),
            OptionSpec(
                "fanout-users", value: "N", default: "1",
                help: "Users the fan-out devices are dealt to (each message goes to one, in turn; must divide --fanout-devices)."),
            OptionSpec("fanout-seconds", value: "SECONDS", default: "5", help: "How long the fan-out senders send."),
            OptionSpec("fanout-window", value: "N", default: "4", help: "Fan-out messages in flight per sender."),
            OptionSpec("storm", value: "none|drop|restart", default: "none", help: "Reconnect storm to measure at the end."),
            OptionSpec("storm-deadline", value: "SECONDS", default: "120", help: "How long a storm may take before devices count as failed."),
            OptionSpec("server-pid", value: "PID", help: "Pid of the server, for its memory and CPU time from /proc."),
            OptionSpec("server-bin", value: "PATH", help: "Start this voipserver (arguments after -- are passed on); needed for --storm restart. With --tls it listens with --tls-listen on --server: pass --tls-cert and --tls-key after --."),
            OptionSpec("server-log", value: "PATH", help: "Append the started server's output here (default: this tool's stderr)."),
            OptionSpec("json", help: "Print one JSON object on stdout (the summary goes to stderr)."),
            OptionSpec("quiet", help: "No progress line."),
        ],
        epilogue: """
            EXIT STATUS: 0 all devices connected and every event arrived; 1 a device failed, \
            an event was lost or refused, or the run could not go on; 64 bad usage.

            EXAMPLES:
              voipload --server-bin .build/release/voipserver --devices 15000 --events 20000 \\
                       --rate 2000 --fanout-devices 1000 --storm restart -- --drain-jitter 2
              voipload --server 127.0.0.1:7443 --server-pid $(pidof voipserver) --devices 5000
              voipload --server localhost:7444 --tls --ca-file ca.pem --server-pid $(pidof voipserver) --devices 15000
              voipload table results/*.json
            """)

    /// Builds a configuration from the command line (subcommand already removed).
    public static func parse(_ arguments: [String]) throws(UsageError) -> (LoadConfiguration, helpRequested: Bool) {
        let options = try parser.parse(arguments)
        var config = LoadConfiguration()
        if options.helpRequested { return (config, true) }
        if let server = options.string("server") {
            for entry in server.split(separator: ",", omittingEmptySubsequences: false) {
                guard let endpoint = SocketCalls.parseEndpoint(String(entry)) else {
                    throw UsageError("--server expects A.B.C.D:PORT[,A.B.C.D:PORT...], got '\(server)'")
                }
                guard endpoint.address >> 24 == 127 else {
                    throw UsageError("--server must be a loopback address (127.0.0.0/8): this tool only loads local servers")
                }
            }
            config.server = server
        }
        config.idleDevices = try options.int("devices", in: 1...1_000_000) ?? config.idleDevices
        if let workers = options.string("workers"), workers != "auto" {
            config.workers = try options.int("workers", in: 1...256) ?? 0
        }
        config.connectRate = try options.double("connect-rate", in: 0...10_000_000) ?? config.connectRate
        config.maxInFlight = try options.int("max-in-flight", in: 1...10_000) ?? config.maxInFlight
        config.sourceAddresses = try options.int("source-addresses", in: 1...WorkloadLayout.maximumSourceAddresses) ?? config.sourceAddresses
        config.authSecret = options.string("auth-secret")
        if let path = options.string("auth-key-file") {
            guard let text = readTextFile(path) else { throw UsageError("--auth-key-file: cannot read \(path)") }
            do {
                config.tokenKey = try TokenKeyFile.parse(text).last
            } catch {
                throw UsageError("--auth-key-file: \(path): \(error.message)")
            }
            config.authKeyFile = path
        }
        if config.authSecret != nil && config.authKeyFile != nil { throw UsageError("give --auth-secret or --auth-key-file, not both") }
        if var tls = try TLSClientConfiguration.parse(options) {
            if tls.serverName == nil, let server = options.string("server")?.prefix(while: { $0 != "," }) {
                // With several nodes, the first one's host: one certificate for the service.
                tls.serverName = String(server[..<(server.lastIndex(of: ":") ?? server.endIndex)])
            }
            tls.serverName = tls.serverName ?? "127.0.0.1"
            do {
                _ = try tls.makeContext()  // a CA file that cannot be loaded is a usage error, now
            } catch {
                throw UsageError("--ca-file: \(error.message)")
            }
            config.tls = tls
        }
        if let keepAlive = try options.int("keepalive", in: 0...86_400) {
            guard keepAlive == 0 || keepAlive >= Int(ProtocolLimits.minimumKeepAliveSeconds) else {
                throw UsageError("--keepalive must be 0 (server's choice) or at least \(ProtocolLimits.minimumKeepAliveSeconds) seconds, got \(keepAlive)")
            }
            config.keepAlive = UInt32(keepAlive)
        }
        config.connectTimeout = try options.double("connect-timeout", in: 1...3600) ?? config.connectTimeout
        config.settleSeconds = try options.double("settle", in: 0...3600) ?? config.settleSeconds
        config.holdSeconds = try options.double("hold", in: 0...86_400) ?? config.holdSeconds
        config.events = try options.int("events", in: 0...100_000_000) ?? config.events
        config.rate = try options.double("rate", in: 1...10_000_000) ?? config.rate
        if let answer = options.string("call-answer") {
            guard let value = CallAnswer(rawValue: answer) else { throw UsageError("--call-answer must be reject or accept, got '\(answer)'") }
            config.callAnswer = value
        }
        config.pushUsers = try options.int("push-users", in: 0...1_000_000) ?? config.pushUsers
        if let mix = options.string("event-mix") {
            guard let value = EventMix(rawValue: mix) else { throw UsageError("--event-mix must be message, call or both, got '\(mix)'") }
            config.mix = value
        }
        config.payloadBytes = try options.int("payload-bytes", in: 16...60_000) ?? config.payloadBytes
        config.lossDeadline = try options.double("loss-deadline", in: 0.1...3600) ?? config.lossDeadline
        if let priority = options.string("probe-priority") {
            guard let value = ProbePriority(rawValue: priority) else { throw UsageError("--probe-priority must be normal or realtime, got '\(priority)'") }
            config.probePriority = value
        }
        config.fanoutDevices = try options.int("fanout-devices", in: 0...100_000) ?? config.fanoutDevices
        config.fanoutUsers = try options.int("fanout-users", in: 1...100_000) ?? config.fanoutUsers
        config.fanoutSeconds = try options.double("fanout-seconds", in: 0.1...3600) ?? config.fanoutSeconds
        config.fanoutWindow = try options.int("fanout-window", in: 1...1000) ?? config.fanoutWindow
        if let storm = options.string("storm") {
            guard let value = StormKind(rawValue: storm) else { throw UsageError("--storm must be none, drop or restart, got '\(storm)'") }
            config.storm = value
        }
        config.stormDeadline = try options.double("storm-deadline", in: 1...3600) ?? config.stormDeadline
        if let pid = try options.int("server-pid", in: 1...Int(Int32.max)) { config.serverPID = Int32(pid) }
        config.serverBinary = options.string("server-bin")
        config.serverLog = options.string("server-log")
        config.json = options.flag("json")
        config.progress = !options.flag("quiet")

        if config.serverBinary != nil {
            config.serverArguments = options.positionals
        } else if let stray = options.positionals.first {
            throw UsageError("unexpected argument '\(stray)' (server arguments after -- need --server-bin)")
        }
        try config.validate()
        return (config, false)
    }

    public func validate() throws(UsageError) {
        if serverBinary != nil && serverPID != nil {
            throw UsageError("--server-pid and --server-bin exclude each other: a started server's pid is known")
        }
        if storm == .restart && serverBinary == nil {
            throw UsageError("--storm restart needs --server-bin: the tool must start the server again")
        }
        if server.contains(",") && (serverBinary != nil || serverPID != nil) {
            throw UsageError("--server with several nodes excludes --server-bin and --server-pid: the tool starts and measures one server")
        }
        if fanoutDevices > 0 && fanoutDevices % fanoutUsers != 0 {
            throw UsageError("--fanout-users \(fanoutUsers) must divide --fanout-devices \(fanoutDevices): every user gets the same number of devices")
        }
        let workers = effectiveWorkers
        let largestShare = WorkloadLayout.share(of: idleDevices, worker: 0, workers: workers)
            + WorkloadLayout.share(of: fanoutDevices, worker: 0, workers: workers) + Self.sendersPerWorker
        if largestShare > Self.connectionsPerWorker + Self.sendersPerWorker {
            throw UsageError("\(largestShare) connections per worker is too many (at most \(Self.connectionsPerWorker)); use --workers \((idleDevices + fanoutDevices + Self.connectionsPerWorker - 1) / Self.connectionsPerWorker) or more")
        }
        // Ephemeral ports per (source address, server) pair: 28,231 with Linux's default
        // range; stay well inside it.
        let perAddress = (idleDevices + fanoutDevices + 2 * workers + sourceAddresses - 1) / sourceAddresses
        if perAddress > 20_000 {
            throw UsageError("\(perAddress) connections per source address would exhaust its ephemeral ports; raise --source-addresses")
        }
    }
}
