import SignalingSupport

/// The command line of reference-probe.
struct ProbeOptions {
    enum WireProtocol: String { case mqtt, voip }

    var wireProtocol: WireProtocol
    var server: (address: UInt32, port: UInt16)
    /// Where the publisher connects: `server` unless given (another node of a cluster, so
    /// that every event crosses from one node to another).
    var publisherServer: (address: UInt32, port: UInt16)
    var subscribers: Int
    var events: Int
    var rate: Double
    var closedLoop: Bool
    var payloadBytes: Int
    var serverPID: Int32?
    var sourceAddresses: Int
    var maxInFlight: Int
    var settleSeconds: Double
    var lossTimeoutSeconds: Double
    var seed: UInt64
    /// `--turns`: where the turns' lines come from, and where each turn is reported done.
    var turns: (go: String, done: String?)?

    static let parser = CommandLineParser(
        command: "reference-probe",
        usage: "reference-probe --protocol mqtt|voip --server 127.0.0.1:PORT [options]",
        summary: """
            Measures push latency with one client-side method for an MQTT broker or voipserver: \
            N idle subscribers, one open-loop publisher whose payloads carry a CLOCK_REALTIME \
            send stamp, and one epoll receiver thread.
            """,
        options: [
            OptionSpec("protocol", value: "mqtt|voip", help: "MQTT 3.1.1 (QoS 0) or the VSIG protocol (docs/PROTOCOL.md)."),
            OptionSpec("server", value: "127.0.0.1:PORT", help: "The server (loopback only)."),
            OptionSpec("publisher-server", value: "127.0.0.1:PORT", default: "--server", help: "Connect the publisher here instead: another node of a cluster, for the latency across nodes (voip only)."),
            OptionSpec("subscribers", value: "N", default: "1000", help: "Idle subscriber connections."),
            OptionSpec("events", value: "E", default: "20000", help: "Events to publish, each to one random subscriber."),
            OptionSpec("rate", value: "R", default: "2000", help: "Events per second (open loop)."),
            OptionSpec("closed-loop", help: "Send each event once the previous one arrived (and the publisher read what had come for it), instead of at --rate."),
            OptionSpec("payload-bytes", value: "B", default: "64", help: "Event payload: an 8-byte send stamp, then zeros."),
            OptionSpec("server-pid", value: "PID", help: "Report the server's resident memory per connection (VmRSS)."),
            OptionSpec("source-addresses", value: "K", default: "32", help: "Spread subscribers over 127.0.0.2 ... 127.0.0.(K+1)."),
            OptionSpec("max-in-flight", value: "N", default: "64", help: "Most subscriber handshakes under way at once (keep it below the server's listen backlog: Mosquitto's is 100)."),
            OptionSpec("settle", value: "SECONDS", default: "2", help: "Pause after the last handshake before measuring memory."),
            OptionSpec("loss-timeout", value: "SECONDS", default: "5", help: "An event not arrived this long after the last send is lost."),
            OptionSpec("seed", value: "N", default: "1", help: "Seed of the random choice of recipients."),
            OptionSpec("turns", value: "PATH", help: "Measure in turns instead of once: after the subscribers connected, read one line per turn from PATH ('closed EVENTS' or 'RATE EVENTS'), run it, and write 'done' to --turns-done (and 'ready' there before the first); at a line 'end' (or the end of PATH), print one report per pacing over all its turns. With FIFOs a script alternates turns between probes of several servers, so that they share the host's slow moments (Tools/bench-reference, BENCH_INTERLEAVE). --events, --rate and --closed-loop are then unused."),
            OptionSpec("turns-done", value: "PATH", help: "With --turns: where the probe writes 'ready' once its subscribers are connected, then 'done' after each turn."),
        ],
        epilogue: "Exit status: 0 all events arrived; 1 something was lost or failed; 2 the probe could not run; 64 usage."
    )

    /// Nil when help was requested.
    static func parse(_ arguments: [String]) throws(UsageError) -> ProbeOptions? {
        let parsed = try parser.parse(arguments)
        if parsed.helpRequested { return nil }
        guard parsed.positionals.isEmpty else { throw UsageError("unexpected argument '\(parsed.positionals[0])'") }
        guard let protocolName = parsed.string("protocol") else { throw UsageError("--protocol is required (mqtt or voip)") }
        guard let wireProtocol = WireProtocol(rawValue: protocolName) else {
            throw UsageError("--protocol must be mqtt or voip, got '\(protocolName)'")
        }
        guard let serverText = parsed.string("server") else { throw UsageError("--server is required") }
        guard let server = Sockets.parseLoopbackEndpoint(serverText) else {
            throw UsageError("--server must be a loopback IPv4 address and port (127.x.y.z:PORT), got '\(serverText)'")
        }
        var publisherServer = server
        if let publisherText = parsed.string("publisher-server") {
            guard let endpoint = Sockets.parseLoopbackEndpoint(publisherText) else {
                throw UsageError("--publisher-server must be a loopback IPv4 address and port (127.x.y.z:PORT), got '\(publisherText)'")
            }
            guard wireProtocol == .voip else { throw UsageError("--publisher-server is for --protocol voip (the nodes of one cluster)") }
            publisherServer = endpoint
        }
        var serverPID: Int32?
        if let pid = try parsed.int("server-pid", in: 1...Int(Int32.max)) { serverPID = Int32(pid) }
        let seed = try parsed.int("seed", in: 0...Int.max) ?? 1
        var turns: (go: String, done: String?)?
        if let go = parsed.string("turns") {
            turns = (go, parsed.string("turns-done"))
        } else if parsed.string("turns-done") != nil {
            throw UsageError("--turns-done is for --turns")
        }
        return ProbeOptions(
            wireProtocol: wireProtocol, server: server, publisherServer: publisherServer,
            subscribers: try parsed.int("subscribers", in: 1...1_000_000) ?? 1000,
            events: try parsed.int("events", in: 1...100_000_000) ?? 20_000,
            rate: try parsed.double("rate", in: 1...1_000_000) ?? 2000,
            closedLoop: parsed.has("closed-loop"),
            payloadBytes: try parsed.int("payload-bytes", in: 8...60_000) ?? 64,
            serverPID: serverPID,
            sourceAddresses: try parsed.int("source-addresses", in: 1...250) ?? 32,
            maxInFlight: try parsed.int("max-in-flight", in: 1...100_000) ?? 64,
            settleSeconds: try parsed.double("settle", in: 0...600) ?? 2,
            lossTimeoutSeconds: try parsed.double("loss-timeout", in: 0.1...600) ?? 5,
            seed: UInt64(seed), turns: turns)
    }

    /// One turn of `--turns`: its line, `closed EVENTS` or `RATE EVENTS`.
    static func turn(_ line: String) throws(UsageError) -> (closedLoop: Bool, rate: Double, events: Int) {
        let words = line.split(separator: " ", omittingEmptySubsequences: true)
        guard words.count == 2, let events = Int(words[1]), events >= 1 else {
            throw UsageError("a turn is 'closed EVENTS' or 'RATE EVENTS', got '\(line)'")
        }
        if words[0] == "closed" { return (true, 2000, events) }
        guard let rate = Double(words[0]), rate >= 1, rate <= 1_000_000 else {
            throw UsageError("a turn's pacing is 'closed' or events/s (1-1000000), got '\(words[0])'")
        }
        return (false, rate, events)
    }

    /// 127.0.0.2, 127.0.0.3, ...
    var sources: [UInt32] { (0..<sourceAddresses).map { (127 << 24) | UInt32(2 + $0) } }
}
