import CLinuxShims
import SignalingProtocol
import SignalingSupport
import SignalingTLS
#if canImport(Glibc)
import Glibc
#endif

/// One worker process of a load run: a single-threaded epoll loop holding its share of
/// the connections, driven by commands from the coordinator on stdin and reporting its
/// counters on stdout (`WorkerCommand`, `WorkerEvent`).
///
/// The loop is built so that the tool's own cost per idle connection stays tiny: state is
/// a `ConnectionTable` (no per-connection objects), all sockets share one read buffer,
/// and timers are scanned only when the earliest one is due.
public final class LoadWorker {
    let setup: WorkerSetup
    let deviceCredentials: DeviceCredentials
    let layout: WorkloadLayout
    let epoll: Epoll
    var table: ConnectionTable
    let clock = SystemClock()
    let startedAt: UInt64
    /// The servers (`setup.servers`); `server(forSlot:)` picks a slot's.
    let servers: [sockaddr_in]
    let decoder = FrameDecoder()
    var random: FastRandom
    /// The trust store and version limit of `setup.tls`, loaded once; nil for plain TCP.
    let tlsContext: TLSClientContext?

    /// One read buffer for every socket: frames are handled straight out of it.
    let readBuffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 64 * 1024, alignment: 8)
    /// Bytes of an incomplete frame, by slot (rare: frames are small and arrive whole).
    var partialFrames: [Int: [UInt8]] = [:]
    /// Bytes the kernel did not take yet, by slot; those slots also wait for EPOLLOUT.
    var unsentBytes: [Int: [UInt8]] = [:]

    /// Slots waiting for their first connection attempt, started in order.
    var connectQueue: [Int] = []
    var connectQueueHead = 0
    /// When the current ramp started and how many of its attempts were started.
    var rampStartedAt: UInt64 = 0
    var rampStarted = 0
    /// The earliest timer among all slots (ms since start); nothing to scan before it.
    var nextTimerDue: UInt32 = .max
    /// The keep-alive interval from the last WELCOME, in seconds.
    var grantedKeepAlive = ProtocolLimits.minimumKeepAliveSeconds

    var status = WorkerStatus()
    var lastStatusSent = WorkerStatus()
    var lastStatusAt: UInt64 = 0

    /// Send to arrival at the device's socket (the kernel's receive timestamp).
    var messageLatency = LatencyHistogram()
    var callLatency = LatencyHistogram()
    var fanoutLatency = LatencyHistogram()
    /// Send to the device's read, messages and calls.
    var readLatency = LatencyHistogram()
    /// The read being processed: when its bytes arrived (kernel receive timestamp, 0 if
    /// none) and when it returned, CLOCK_REALTIME ns like the probes' send stamps.
    var currentRead = ReadStamps()
    var handshakeLatency = LatencyHistogram()
    /// Connect start to TLS handshake done (TLS runs).
    var tlsHandshakeLatency = LatencyHistogram()

    var probe = ProbeSchedule()
    var fanout = FanoutSchedule()
    /// The worker runs at SCHED_FIFO for the current probe phase (`ProbePriority`).
    var realtime = false
    var nextRequestID: UInt32 = 1
    /// Requests whose answer is no latency probe's, by request id (`SpecialRequest`).
    var specialRequests: [UInt32: SpecialRequest] = [:]

    var controlBuffer = LineBuffer()
    var running = true

    static let controlToken = UInt64.max
    static let controlDescriptor: Int32 = 0

    /// - Parameter tlsContext: made from `setup.tls` (by `WorkerMain`, which reports a CA file
    ///   that cannot be loaded).
    public init(setup: WorkerSetup, tlsContext: TLSClientContext? = nil) throws(SystemError) {
        self.setup = setup
        self.tlsContext = tlsContext
        deviceCredentials = DeviceCredentials(setup: setup)
        layout = WorkloadLayout(
            worker: setup.worker, workerCount: setup.workerCount, idleDevices: setup.idleDevices,
            fanoutDevices: setup.fanoutDevices, fanoutUsers: setup.fanoutUsers, sourceAddresses: setup.sourceAddresses)
        epoll = try Epoll()
        table = ConnectionTable(count: layout.slotCount)
        startedAt = SystemClock().now().nanoseconds
        servers = setup.servers.map { SocketCalls.socketAddress($0.address, port: $0.port) }
        random = FastRandom(seed: setup.runID &+ UInt64(setup.worker) &* 0x1_0000_0001)
        status.worker = setup.worker
    }

    deinit { readBuffer.deallocate() }

    /// The server a slot dials, always the same one: connection number g goes to server
    /// g mod n, so the devices spread evenly over a cluster's nodes, as behind a balancer.
    func server(forSlot slot: Int) -> sockaddr_in { servers[layout.connectionNumber(ofSlot: slot) % servers.count] }

    /// Runs until told to quit or until stdin closes (the coordinator is gone).
    public func run() {
        try? SocketCalls.setNonBlocking(Self.controlDescriptor)
        _ = epoll.add(Self.controlDescriptor, token: Self.controlToken, events: Epoll.input)
        while running {
            epoll.wait(timeoutNanoseconds: loopTimeout()) { token, events in
                if token == Self.controlToken {
                    readControl()
                } else {
                    handleReadiness(slot: Int(token), events: events)
                }
            }
            let now = clock.now().nanoseconds
            startQueuedConnections(now: now)
            runDueTimers(now: now)
            sendDueProbes(now: now)
            sendFanout(now: now)
            publishStatusIfDue(now: now)
        }
        for slot in 0..<table.count where table.fd[slot] >= 0 {
            releaseTLS(slot: slot)
            close(table.fd[slot])
        }
    }

    /// Nanoseconds to wait for readiness: until the next probe is due while probing (each
    /// goes out on its own schedule, never two in one burst, which would time the second
    /// behind the first), short waits while something else is paced (ramp, fan-out), long
    /// ones while just holding.
    func loopTimeout() -> Int64 {
        let millisecond: Int64 = 1_000_000
        if probe.isSending {
            let now = clock.now().nanoseconds
            let due = probe.dueAt(probe.sent)
            return due <= now ? 0 : min(millisecond, Int64(due - now))
        }
        if fanout.isSending { return millisecond }
        if connectQueueHead < connectQueue.count { return 2 * millisecond }
        let now = millisecondsNow()
        if nextTimerDue <= now { return 0 }
        return Int64(min(100, nextTimerDue - now)) * millisecond
    }

    func millisecondsNow() -> UInt32 { milliseconds(clock.now().nanoseconds) }

    func milliseconds(_ nanoseconds: UInt64) -> UInt32 {
        UInt32(truncatingIfNeeded: (nanoseconds &- startedAt) / 1_000_000)
    }

    // MARK: - Control

    func readControl() {
        var chunk = [UInt8](repeating: 0, count: 4096)
        let count = chunk.withUnsafeMutableBytes { read(Self.controlDescriptor, $0.baseAddress, $0.count) }
        if count == 0 { running = false; return }  // the coordinator is gone
        guard count > 0 else { return }
        for line in controlBuffer.append(chunk[0..<count]) {
            guard let command = WorkerLine.decode(WorkerCommand.self, from: line) else {
                emit(.fatal("worker \(setup.worker): unreadable command \(String(decoding: line, as: UTF8.self))"))
                running = false
                return
            }
            handle(command)
        }
    }

    func handle(_ command: WorkerCommand) {
        let now = clock.now().nanoseconds
        switch command {
        case .setup:
            break  // only valid as the first line, consumed by `WorkerMain`
        case .connect(let group):
            enqueue(group, now: now)
        case .probe(let count, let rate, let mix):
            if setup.probePriority == .realtime && !realtime {
                let error = voipload_set_realtime(1)
                guard error == 0 else {
                    emit(.fatal("worker \(setup.worker): cannot run the probes at SCHED_FIFO: \(String(cString: strerror(error)))"))
                    running = false
                    return
                }
                realtime = true
                status.realtimeWorkers = 1
            }
            probe = ProbeSchedule(count: count, rate: rate, mix: mix, startedAt: now)
            status.probesDone = count == 0
        case .startFanout(let window):
            fanout = FanoutSchedule(window: window, sending: true)
        case .stopFanout:
            fanout.sending = false
        case .dropConnections:
            dropIdleConnections(now: now)
        case .report:
            // The report closes the probe phase: back to normal scheduling before a
            // fan-out or a storm keeps this worker busy.
            if realtime, voipload_set_realtime(0) == 0 { realtime = false }
            refreshResidentBytes()
            emit(.report(WorkerReport(
                status: status, messageLatency: HistogramSnapshot(messageLatency),
                callLatency: HistogramSnapshot(callLatency), fanoutLatency: HistogramSnapshot(fanoutLatency),
                readLatency: HistogramSnapshot(readLatency), handshakeLatency: HistogramSnapshot(handshakeLatency),
                tlsHandshakeLatency: tlsContext == nil ? nil : HistogramSnapshot(tlsHandshakeLatency))))
        case .quit:
            running = false
        }
    }

    func enqueue(_ group: ConnectionGroup, now: UInt64) {
        let slots: [Int]
        switch group {
        case .idle: slots = Array(layout.idleSlots)
        case .senders: slots = [layout.probeSenderSlot, layout.fanoutSenderSlot]
        case .fanout: slots = Array(layout.fanoutDeviceSlots)
        }
        if connectQueueHead >= connectQueue.count {
            connectQueue = []
            connectQueueHead = 0
            rampStartedAt = now
            rampStarted = 0
        }
        let deadline = milliseconds(now) &+ UInt32(setup.connectTimeoutSeconds * 1000)
        for slot in slots where table.state[slot] == .unstarted {
            table.giveUpAt[slot] = deadline
            connectQueue.append(slot)
        }
    }

    func publishStatusIfDue(now: UInt64) {
        guard now &- lastStatusAt >= 100_000_000 else { return }
        lastStatusAt = now
        guard status != lastStatusSent else { return }
        lastStatusSent = status
        emit(.status(status))
    }

    func refreshResidentBytes() {
        status.residentBytes = ProcessStats.residentBytes(pid: getpid()) ?? 0
    }

    func emit(_ event: WorkerEvent) {
        let bytes = WorkerLine.encode(event)
        bytes.withUnsafeBytes { buffer in
            var offset = 0
            while offset < buffer.count {
                let written = write(1, buffer.baseAddress! + offset, buffer.count - offset)
                if written < 0 {
                    if errno == EINTR { continue }
                    running = false  // the coordinator is gone
                    return
                }
                offset += written
            }
        }
    }
}

/// When the bytes of one read arrived and when the read returned (CLOCK_REALTIME ns).
struct ReadStamps {
    /// The kernel's receive timestamp (SO_TIMESTAMPNS; for TCP, of the read's last
    /// segment), 0 when it gave none.
    var arrived: UInt64 = 0
    var read: UInt64 = 0
}

/// The pacing of this worker's share of latency probes.
struct ProbeSchedule {
    var count = 0
    var rate: Double = 0
    var mix: EventMix = .both
    var startedAt: UInt64 = 0
    var sent = 0

    var isSending: Bool { sent < count }

    /// When probe `number` is due (monotonic ns).
    func dueAt(_ number: Int) -> UInt64 {
        guard rate > 0 else { return startedAt }
        return startedAt + UInt64(Double(number) / rate * 1e9)
    }

    /// How many probes should have been sent by `now`.
    func due(now: UInt64) -> Int {
        guard rate > 0 else { return count }
        let elapsed = Double(now &- startedAt) / 1e9
        return min(count, Int(elapsed * rate) + 1)
    }
}

/// The closed-loop fan-out sender: keeps `window` messages in flight, a message counting
/// as complete once the receipts of all fan-out devices for it have arrived.
struct FanoutSchedule {
    var window = 0
    var sending = false

    var isSending: Bool { sending }
}
