import Foundation
import SignalingTLS

/// What a worker process needs to know, sent once as its first command.
public struct WorkerSetup: Codable, Sendable, Equatable {
    public var worker: Int
    public var workerCount: Int
    /// The servers; the device of connection number g dials `servers[g % servers.count]`.
    public var servers: [LoopbackEndpoint]
    public var authSecret: String?
    /// The device-token key (`--auth-key-file`'s last key), when devices present tokens.
    public var tokenKeyID: String? = nil
    public var tokenKeySecret: [UInt8]? = nil
    /// HELLO keep-alive request: 0 = the server's interval.
    public var requestedKeepAlive: UInt32
    public var idleDevices: Int
    public var fanoutDevices: Int
    /// The users the fan-out devices are dealt to (`WorkloadLayout.fanoutUser(ofDevice:users:)`).
    public var fanoutUsers: Int = 1
    public var sourceAddresses: Int
    /// Connection attempts started per second by this worker; 0 = as fast as the
    /// in-flight limit allows.
    public var connectRate: Double
    /// Connects and handshakes in progress at once in this worker.
    public var maxInFlight: Int
    /// A device that has not (re)connected this long after its first attempt has failed.
    public var connectTimeoutSeconds: Double
    /// Size of each probe body (timestamp, run id, padding).
    public var payloadBytes: Int
    /// Distinguishes this run's probes from stale events of an earlier run.
    public var runID: UInt64
    /// How the worker is scheduled while it sends and receives latency probes.
    public var probePriority: ProbePriority
    /// TLS to the server, its `serverName` already set; nil for plain TCP.
    public var tls: TLSClientConfiguration? = nil
    /// What an idle device does with a call probe (`--call-answer`).
    public var callAnswer: CallAnswer = .reject
    /// Users `w0`...`w<n-1>` with a push token and no connection (`--push-users`): a
    /// quarter of the probes go to them, each a push wake-up, not a latency probe.
    public var pushUsers: Int = 0
}

/// What an idle device does with CALL_INCOMING.
public enum CallAnswer: String, Codable, Sendable, CaseIterable {
    /// CALL_REJECT at once: the call ends on the server.
    case reject
    /// CALL_RINGING and CALL_ACCEPT; the caller hangs up on CALL_ACCEPTED (a call's whole
    /// life: ring, answer, hang-up, across the users' shards).
    case accept
}

/// How the workers are scheduled during the push-latency phase.
///
/// On a machine where the tool shares CPUs with the server, the server's background
/// threads (the store writer's commits) preempt the tool's workers. A preempted worker
/// reads its pushes and sends its acknowledgements late and in a burst, and its traffic
/// pauses: the server then meets a burst, or a loop whose busy-poll window ran out while
/// nothing came. Both show up as push latency, and they grow with the writer's commits,
/// so with the store's size. `realtime` measures the server as remote devices would see
/// it: a SCHED_FIFO worker runs as soon as it has something to do.
public enum ProbePriority: String, Codable, Sendable, CaseIterable {
    /// Scheduled like any process (SCHED_OTHER).
    case normal
    /// SCHED_FIFO priority 1 from the `probe` command until the `report` that ends the
    /// phase; the ramp, fan-out and storm run at normal priority (busy workers at a
    /// real-time priority would starve the server's threads on their CPU).
    case realtime
}

/// Connections that are started together.
public enum ConnectionGroup: String, Codable, Sendable {
    case idle, senders, fanout
}

/// Which kinds of event the latency probes are.
public enum EventMix: String, Codable, Sendable, CaseIterable {
    case message, call, both
}

/// Coordinator → worker, one JSON object per line on the worker's stdin.
public enum WorkerCommand: Codable, Sendable, Equatable {
    case setup(WorkerSetup)
    case connect(ConnectionGroup)
    /// Send `count` probes at `rate` per second to random idle devices.
    case probe(count: Int, rate: Double, mix: EventMix)
    /// Send fan-out messages, at most `window` unconfirmed at once, until told to stop.
    case startFanout(window: Int)
    case stopFanout
    /// Storm: drop every idle device's connection at once and reconnect it at once.
    case dropConnections
    /// Send a full report (counters and histograms).
    case report
    case quit
}

/// A worker's counters, sent every 100 ms while anything moves.
public struct WorkerStatus: Codable, Sendable, Equatable {
    public var worker = 0
    public var idleConnected = 0
    public var idleFailed = 0
    public var sendersConnected = 0
    public var fanoutConnected = 0
    public var inFlight = 0
    public var connectAttempts: UInt64 = 0
    /// WELCOMEs received, cumulative.
    public var handshakes: UInt64 = 0
    public var resumed: UInt64 = 0
    /// WELCOMEs received by idle devices only (a storm is over when each had one more).
    public var idleHandshakes: UInt64 = 0
    /// Why connections ended or failed, e.g. "CLOSE goingAway", "connect: Connection refused".
    public var disconnects: [String: UInt64] = [:]
    /// Why devices gave up for good (they count in idleFailed and the exit status).
    public var failures: [String: UInt64] = [:]

    public var probesSent: UInt64 = 0
    public var probesAccepted: UInt64 = 0
    public var probesRefused: UInt64 = 0
    public var probesReceived: UInt64 = 0
    public var probeReceipts: UInt64 = 0
    public var callsEnded: UInt64 = 0
    /// Calls answered (CALL_ACCEPTED to the caller, which then hangs up: `CallAnswer.accept`).
    public var callsAnswered: UInt64 = 0
    /// Probes to the push users (`WorkerSetup.pushUsers`): each wakes an offline device
    /// through the push gateway (a call is cancelled once accepted). Not latency probes.
    public var pushProbesSent: UInt64 = 0
    public var pushProbesAccepted: UInt64 = 0
    public var pushProbesRefused: UInt64 = 0
    public var probesDone = false
    /// Workers that ran the probe phase at `ProbePriority.realtime` (a sum over workers).
    public var realtimeWorkers = 0
    /// Events whose sequence number was already processed (re-sent duplicates).
    public var duplicates: UInt64 = 0
    /// Events from another run or of a kind this connection should never get.
    public var unexpectedEvents: UInt64 = 0
    /// Probe events read without a kernel receive timestamp: their arrival is the read.
    public var unstampedEvents: UInt64 = 0
    /// The server forgot a device's sequence (restart without persistence).
    public var sequenceResets: UInt64 = 0
    /// TLS handshakes completed: full ones (certificate, signature, key exchange) and
    /// ones that resumed an earlier session from its ticket.
    public var tlsFullHandshakes: UInt64 = 0
    public var tlsResumedHandshakes: UInt64 = 0

    public var fanoutSent: UInt64 = 0
    public var fanoutAccepted: UInt64 = 0
    public var fanoutRefused: UInt64 = 0
    public var fanoutDelivered: UInt64 = 0
    public var fanoutReceipts: UInt64 = 0

    public var residentBytes: UInt64 = 0

    public init() {}
}

/// A worker's answer to `report`.
public struct WorkerReport: Codable, Sendable, Equatable {
    public var status: WorkerStatus
    public var messageLatency: HistogramSnapshot
    public var callLatency: HistogramSnapshot
    public var fanoutLatency: HistogramSnapshot
    /// Send to read by the device's process (messages and calls): adds the tool's own
    /// wake-up and read to the arrival latencies above.
    public var readLatency: HistogramSnapshot
    public var handshakeLatency: HistogramSnapshot
    /// TCP connected to TLS handshake done (TLS runs only).
    public var tlsHandshakeLatency: HistogramSnapshot? = nil
}

/// Worker → coordinator, one JSON object per line on the worker's stdout.
public enum WorkerEvent: Codable, Sendable, Equatable {
    case status(WorkerStatus)
    case report(WorkerReport)
    /// The worker cannot go on (bad setup, descriptor limit); it exits after this.
    case fatal(String)
}

/// Encodes and decodes the line protocol between coordinator and workers.
public enum WorkerLine {
    public static func encode<T: Encodable>(_ value: T) -> [UInt8] {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        // JSON text never contains a raw newline, so one value is exactly one line.
        var bytes = (try? [UInt8](encoder.encode(value))) ?? Array("{}".utf8)
        bytes.append(UInt8(ascii: "\n"))
        return bytes
    }

    public static func decode<T: Decodable>(_ type: T.Type, from line: some Collection<UInt8>) -> T? {
        try? JSONDecoder().decode(type, from: Data(line))
    }
}

/// Splits a byte stream into lines.
public struct LineBuffer: Sendable {
    private var pending: [UInt8] = []

    public init() {}

    /// Appends bytes and returns every complete line (without its newline).
    public mutating func append(_ bytes: some Collection<UInt8>) -> [[UInt8]] {
        pending.append(contentsOf: bytes)
        var lines: [[UInt8]] = []
        var start = 0
        while let newline = pending[start...].firstIndex(of: UInt8(ascii: "\n")) {
            lines.append(Array(pending[start..<newline]))
            start = newline + 1
        }
        if start > 0 { pending.removeFirst(start) }
        return lines
    }
}
