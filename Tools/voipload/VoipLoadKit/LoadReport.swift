/// The result of a load run: printed as a human summary, or as one JSON object.
/// Latencies are in microseconds, memory in bytes, rates per second.
public struct LoadReport: Codable, Sendable {
    public struct Latency: Codable, Sendable, Equatable {
        public var count: UInt64
        public var p50: Double
        public var p90: Double
        public var p99: Double
        public var p999: Double
        public var max: Double
        public var mean: Double

        public init(_ histogram: LatencyHistogram) {
            func micros(_ nanoseconds: UInt64) -> Double { (Double(nanoseconds) / 100).rounded() / 10 }
            count = histogram.totalCount
            p50 = micros(histogram.value(atPercentile: 50))
            p90 = micros(histogram.value(atPercentile: 90))
            p99 = micros(histogram.value(atPercentile: 99))
            p999 = micros(histogram.value(atPercentile: 99.9))
            max = micros(histogram.maximum)
            mean = (histogram.mean / 100).rounded() / 10
        }
    }

    public struct Setup: Codable, Sendable {
        public var server: String
        public var serverStarted: Bool
        public var devices: Int
        public var workers: Int
        public var sourceAddresses: Int
        public var connectRate: Double
        public var maxInFlightPerWorker: Int
        public var payloadBytes: Int
    }

    public struct Connections: Codable, Sendable {
        public var requested: Int
        public var connected: Int
        public var failed: Int
        public var failureReasons: [String: UInt64]
        /// Disconnects seen along the way (CLOSE codes, connect errors), not failures.
        public var disconnectReasons: [String: UInt64]
        public var rampSeconds: Double
        /// Connect + handshake completions per second over the whole ramp.
        public var handshakesPerSecond: Double
        /// Best one-second window during the ramp.
        public var peakHandshakesPerSecond: Double
        /// Connect start to WELCOME, every handshake of the run.
        public var handshakeLatency: Latency
        /// The server's CPU time (utime + stime) during the ramp, and the idle devices'
        /// connections (TCP, TLS when on, HELLO/WELCOME) per second of it: what one core
        /// of the server's loops can accept (nil without the server's pid).
        public var rampServerCPUSeconds: Double? = nil
        public var handshakesPerServerCPUSecond: Double? = nil
    }

    /// TLS handshakes of a `--tls` run.
    public struct TLS: Codable, Sendable {
        /// Full handshakes (certificate, signature, key exchange) and resumed ones (a
        /// ticket from the device's previous connection), the whole run.
        public var fullHandshakes: UInt64
        public var resumedHandshakes: UInt64
        /// Connect start to TLS done, every TLS handshake of the run.
        public var handshakeLatency: Latency
    }

    public struct Memory: Codable, Sendable {
        public var serverRSSBefore: UInt64?
        public var serverRSSAfter: UInt64?
        /// (after − before) / devices: the server's user-space memory per idle connection.
        public var serverBytesPerConnection: Double?
        public var tcpMemoryPagesBefore: UInt64?
        public var tcpMemoryPagesAfter: UInt64?
        /// Kernel TCP buffer memory per connection, both ends of the loopback pair.
        public var kernelBytesPerConnection: Double?
        public var tcpSocketsInUse: UInt64?
        /// This tool's resident memory, all workers, and per connection held.
        public var toolRSS: UInt64
        public var toolBytesPerConnection: Double
    }

    public struct Push: Codable, Sendable {
        public var requested: Int
        public var rate: Double
        public var mix: String
        /// `ProbePriority` of the workers during the phase (nil in reports of older versions).
        public var priority: String?
        public var sent: UInt64
        public var accepted: UInt64
        public var refused: UInt64
        public var received: UInt64
        /// Sent and neither refused nor arrived within the loss deadline.
        public var lost: UInt64
        public var duplicates: UInt64
        public var receipts: UInt64
        public var callsEnded: UInt64
        /// Server CPU time (utime + stime) per probe over the phase: the whole exchange of
        /// request, reply, event, ACK and receipt (or reject and CALL_ENDED).
        public var serverCPUMicrosPerProbe: Double?
        /// Send to arrival at the device's socket (the kernel's receive timestamp): the
        /// server's push latency, messages and calls.
        public var latency: Latency
        public var messageLatency: Latency
        public var callLatency: Latency
        /// Send to read by the device's process: adds the tool's wake-up and read (nil in
        /// reports of older versions).
        public var readLatency: Latency?
        /// Events read without a kernel receive timestamp (their arrival is the read).
        public var unstampedEvents: UInt64?
        /// Calls answered and hung up (`--call-answer accept`; nil in older reports).
        public var callsAnswered: UInt64? = nil
        /// Probes to the push users (`--push-users`): sent, and refused (nil: none).
        public var pushProbes: UInt64? = nil
        public var pushProbesRefused: UInt64? = nil
    }

    public struct Fanout: Codable, Sendable {
        /// Fan-out devices in all, dealt to `users` users (each message goes to one user's).
        public var devices: Int
        public var users: Int
        public var senders: Int
        public var seconds: Double
        public var messages: UInt64
        /// MESSAGE events that arrived at the fan-out devices.
        public var delivered: UInt64
        /// MESSAGE_DELIVERED receipts that arrived at the senders.
        public var receipts: UInt64
        public var lost: UInt64
        public var serverCPUSeconds: Double?
        /// (delivered + receipts) / wall seconds.
        public var eventsPerSecond: Double
        /// (delivered + receipts) / server CPU seconds: events per second per core.
        public var eventsPerCPUSecond: Double?
        /// Send to arrival at each fan-out device's socket.
        public var latency: Latency
    }

    public struct Storm: Codable, Sendable {
        public var kind: String
        public var devices: Int
        public var recovered: Bool
        /// From the drop (or SIGTERM) until every idle device had a session again.
        public var recoverySeconds: Double
        /// From SIGTERM until the new server accepted connections (restart only).
        public var serverDownSeconds: Double?
        public var handshakes: UInt64
        public var resumed: UInt64
        public var peakHandshakesPerSecond: Double
        public var disconnectReasons: [String: UInt64]
        /// TLS handshakes of the storm, full and resumed (`--tls` runs).
        public var tlsFullHandshakes: UInt64? = nil
        public var tlsResumedHandshakes: UInt64? = nil
    }

    public var setup: Setup
    public var connections: Connections
    public var memory: Memory
    public var push: Push?
    public var fanout: Fanout?
    public var storm: Storm?
    public var tls: TLS?
    /// Everything that makes the run fail (and the exit status 1).
    public var problems: [String]
    public var passed: Bool { problems.isEmpty }

    enum CodingKeys: String, CodingKey {
        case setup, connections, memory, push, fanout, storm, tls, problems, passed
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(setup, forKey: .setup)
        try container.encode(connections, forKey: .connections)
        try container.encode(memory, forKey: .memory)
        try container.encodeIfPresent(push, forKey: .push)
        try container.encodeIfPresent(fanout, forKey: .fanout)
        try container.encodeIfPresent(storm, forKey: .storm)
        try container.encodeIfPresent(tls, forKey: .tls)
        try container.encode(problems, forKey: .problems)
        try container.encode(passed, forKey: .passed)
    }

    public init(
        setup: Setup, connections: Connections, memory: Memory, push: Push?, fanout: Fanout?,
        storm: Storm?, tls: TLS? = nil, problems: [String]
    ) {
        self.tls = tls
        self.setup = setup
        self.connections = connections
        self.memory = memory
        self.push = push
        self.fanout = fanout
        self.storm = storm
        self.problems = problems
    }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        setup = try container.decode(Setup.self, forKey: .setup)
        connections = try container.decode(Connections.self, forKey: .connections)
        memory = try container.decode(Memory.self, forKey: .memory)
        push = try container.decodeIfPresent(Push.self, forKey: .push)
        fanout = try container.decodeIfPresent(Fanout.self, forKey: .fanout)
        storm = try container.decodeIfPresent(Storm.self, forKey: .storm)
        tls = try container.decodeIfPresent(TLS.self, forKey: .tls)
        problems = try container.decode([String].self, forKey: .problems)
    }
}
