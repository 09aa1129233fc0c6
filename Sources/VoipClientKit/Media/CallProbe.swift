import SignalingSupport
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// The call-path probe of one call: a UDP socket that echoes the peer's probe requests
/// for as long as the call lasts, and, once the call is answered, sends its own burst of
/// requests to the peer's announced address and measures what comes back.
///
/// Threading: one thread owns the socket and all measuring state; it polls the socket
/// and a wake-up pipe, so a command (`beginBurst`, `stop`) takes effect at once. Other
/// threads only touch `commands` (under its mutex). Reports go to `report`, called on
/// the probe's thread; consumers hop to their own queue.
public final class CallProbe: @unchecked Sendable {
    public struct Configuration: Sendable, Equatable {
        /// Requests in the burst; 0 sends none (the peer is told "done" at once).
        public var packets: Int
        public var interval: Duration
        /// How long after the last request its echo may still come back.
        public var lateWait: Duration

        public init(packets: Int = 50, interval: Duration = .milliseconds(20), lateWait: Duration = .seconds(1)) {
            self.packets = packets
            self.interval = interval
            self.lateWait = lateWait
        }

        /// The longest a burst can take, from its start to its result.
        public var longestBurst: Duration { interval * max(packets - 1, 0) + lateWait }
    }

    public enum Report: Sendable, Equatable {
        /// Our burst is over: what it measured.
        case burstFinished(ProbeStatistics, peer: UDPEndpoint)
        /// The peer said its own burst is over.
        case peerFinished
    }

    public let local: UDPEndpoint
    /// Random per call: echoes carrying it answer our own requests.
    public let token: UInt64
    public let configuration: Configuration

    private struct Commands {
        var burstTarget: UDPEndpoint?
        var stopRequested = false
    }

    private let socket: UDPProbeSocket
    private let wake: WakePipe
    private let commands = Mutex(Commands())
    private let thread = Mutex<JoinableThread?>(nil)
    private let report: @Sendable (Report) -> Void
    /// The `done` datagram is sent this many times (UDP may drop one).
    private static let doneRepeats = 3

    /// Binds the socket (port 0 picks a free one); nothing runs until `start`.
    public init(bindingTo endpoint: UDPEndpoint, configuration: Configuration,
                report: @escaping @Sendable (Report) -> Void) throws(SystemError) {
        socket = try UDPProbeSocket(bindingTo: endpoint)
        do {
            wake = try WakePipe()
        } catch {
            socket.close()
            throw error
        }
        local = socket.local
        token = UInt64.random(in: 1...UInt64.max)
        self.configuration = configuration
        self.report = report
    }

    deinit { stop() }

    /// Starts the thread: from now on the peer's requests are echoed.
    public func start() {
        thread.withLock { thread in
            guard thread == nil else { return }
            thread = JoinableThread { [self] in run() }
        }
    }

    /// Starts our burst towards the peer's announced address (once per call).
    public func beginBurst(to peer: UDPEndpoint) {
        commands.withLock { $0.burstTarget = peer }
        wake.signal()
    }

    /// Ends the thread and closes the socket. Harmless to call twice.
    public func stop() {
        // Only the first caller tears down; the socket is closed after the thread ended.
        let first = commands.withLock { commands -> Bool in
            guard !commands.stopRequested else { return false }
            commands.stopRequested = true
            return true
        }
        guard first else { return }
        wake.signal()
        let joinable = thread.withLock { thread in
            defer { thread = nil }
            return thread
        }
        joinable?.join()
        socket.close()
    }

    // MARK: The probe's thread

    private struct Burst {
        let peer: UDPEndpoint
        let startedAt: Instant
        var sent = 0
        var lastSentAt: Instant
        var seen = Set<UInt32>()
        var roundTrips: [Duration] = []
    }

    private func run() {
        let clock = SystemClock()
        var burst: Burst?
        var burstOver = false
        var peerFinishedReported = false
        var buffer = [UInt8](repeating: 0, count: 2048)
        while true {
            let (target, stopRequested) = commands.withLock { commands in
                defer { commands.burstTarget = nil }
                return (commands.burstTarget, commands.stopRequested)
            }
            if stopRequested { return }
            var now = clock.now()
            if let target, burst == nil, !burstOver {
                burst = Burst(peer: target, startedAt: now, lastSentAt: now)
            }
            var wait: Duration?
            if var current = burst {
                if current.sent < configuration.packets, now >= current.startedAt + configuration.interval * current.sent {
                    let request = ProbePacket(kind: .request, token: token, sequence: UInt32(current.sent), sentAt: now.nanoseconds)
                    socket.send(request.bytes, to: current.peer)
                    current.sent += 1
                    current.lastSentAt = now
                }
                if current.sent == configuration.packets
                    && (current.roundTrips.count == current.sent || now >= current.lastSentAt + configuration.lateWait) {
                    finish(current)
                    burst = nil
                    burstOver = true
                } else {
                    let next = current.sent < configuration.packets
                        ? current.startedAt + configuration.interval * current.sent
                        : current.lastSentAt + configuration.lateWait
                    wait = next - now
                    burst = current
                }
            }
            var fds = [pollfd(fd: socket.descriptor, events: Int16(POLLIN), revents: 0),
                       pollfd(fd: wake.readDescriptor, events: Int16(POLLIN), revents: 0)]
            // Round up, so a wait under a millisecond does not spin.
            let timeout = wait.map { Int32(clamping: ($0.microseconds + 999) / 1000) } ?? -1
            if case .failed = SystemCall.io({ Int(poll(&fds, 2, timeout)) }) { return }
            if fds[1].revents != 0 { wake.drain() }
            guard fds[0].revents != 0 else { continue }
            now = clock.now()
            while let (count, source) = socket.receive(into: &buffer) {
                guard let packet = ProbePacket(decoding: buffer[0..<count]) else { continue }
                switch packet.kind {
                case .request:
                    socket.send(packet.echo.bytes, to: source)
                case .echo:
                    guard packet.token == token, var current = burst, packet.sequence < current.sent,
                          current.seen.insert(packet.sequence).inserted
                    else { continue }
                    current.roundTrips.append(now - Instant(nanoseconds: packet.sentAt))
                    burst = current
                case .done:
                    if packet.token != token && !peerFinishedReported {
                        peerFinishedReported = true
                        report(.peerFinished)
                    }
                }
            }
        }
    }

    private func finish(_ burst: Burst) {
        report(.burstFinished(ProbeStatistics(sent: burst.sent, roundTrips: burst.roundTrips), peer: burst.peer))
        let done = ProbePacket(kind: .done, token: token, sequence: UInt32(burst.sent), sentAt: 0)
        for _ in 0..<Self.doneRepeats { socket.send(done.bytes, to: burst.peer) }
    }
}
