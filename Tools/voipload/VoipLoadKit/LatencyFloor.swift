import CLinuxShims
import SignalingSupport
#if canImport(Glibc)
import Glibc
#endif

/// What this machine can do at best for a two-hop loopback push, to read the server's
/// latency against.
///
/// A relay process forwards 8-byte send stamps from one TCP connection to another, as the
/// server forwards an event from a sender to a device, with the same wake-ups (the relay
/// sleeps in read(2) until data arrives, the receiver sleeps in read(2) until the relay
/// writes) but no protocol work at all. On a virtual machine these wake-ups dominate; no
/// server can push faster than this floor. Each stamp gets the benchmark's two latencies:
/// to its arrival at the receiving socket (the kernel's receive timestamp: one wake-up,
/// the relay's) and to its read by the receiver (both wake-ups).
///
/// How long a wake-up takes depends on how long the woken thread slept: a guest's idle
/// CPU polls for a while before it halts (cpuidle haltpoll), and waking a halted one costs
/// a trip through the hypervisor. So there are two floors:
/// - `.receiverJustSent`: the thread that sent the stamp reads it back, so it has just
///   gone to sleep when it is woken. The best case, below anything a load test sees.
/// - `.idleReceiver`: another thread receives, and sleeps between stamps like an idle
///   device of the benchmark does between probes. This is the floor to read the
///   benchmark's push latency against.
enum LatencyFloor {
    enum Receiver {
        case receiverJustSent
        case idleReceiver
    }

    /// Send to arrival at the receiving socket, and send to read by the receiver.
    struct Result {
        var arrival = LatencyHistogram()
        var read = LatencyHistogram()

        mutating func record(sentAt: UInt64, arrivedAt: UInt64, readAt: UInt64) {
            read.record(nanoseconds: readAt > sentAt ? readAt - sentAt : 0)
            let arrived = arrivedAt == 0 ? readAt : arrivedAt
            arrival.record(nanoseconds: arrived > sentAt ? arrived - sentAt : 0)
        }
    }

    /// Measures `samples` stamps, `gapMicroseconds` apart.
    static func measure(samples: Int, gapMicroseconds: Int, receiver: Receiver) throws(LoadError) -> Result {
        guard let port = SocketCalls.freeLoopbackPort() else { throw LoadError("no free loopback port for the floor relay") }
        let relay: ChildProcess
        do {
            relay = try ChildProcess.spawn(
                ChildProcess.currentExecutablePath(), arguments: ["floor-relay", String(port)],
                pipeInput: false, stdout: .discard, stderr: .inherit)
        } catch {
            throw LoadError("cannot start the floor relay: \(error)")
        }
        defer {
            relay.send(signal: SIGKILL)
            _ = relay.waitForExit(timeoutSeconds: 5)
        }
        let sending = try connectWithRetry(port: port, role: 1)
        defer { close(sending) }
        let receiving = try connectWithRetry(port: port, role: 2)
        defer { close(receiving) }
        _ = voipload_enable_receive_timestamps(receiving)

        if receiver == .idleReceiver {
            return try measureWithIdleReceiver(
                samples: samples, gapMicroseconds: gapMicroseconds, sending: sending, receiving: receiving)
        }
        var result = Result()
        for _ in 0..<samples {
            var stamp = voipload_realtime_ns()
            guard write(sending, &stamp, 8) == 8 else { throw LoadError("floor relay: write failed") }
            guard let (echoed, arrivedAt) = readStamp(receiving) else { throw LoadError("floor relay: the relay went away") }
            result.record(sentAt: echoed, arrivedAt: arrivedAt, readAt: voipload_realtime_ns())
            usleep(UInt32(gapMicroseconds))
        }
        return result
    }

    private static func measureWithIdleReceiver(
        samples: Int, gapMicroseconds: Int, sending: Int32, receiving: Int32
    ) throws(LoadError) -> Result {
        /// Written by the receiver thread only, read after it is joined.
        final class Outcome: @unchecked Sendable {
            var result = Result()
            var complete = false
        }
        let outcome = Outcome()
        let receiverThread = JoinableThread {
            for _ in 0..<samples {
                guard let (echoed, arrivedAt) = readStamp(receiving) else { return }
                outcome.result.record(sentAt: echoed, arrivedAt: arrivedAt, readAt: voipload_realtime_ns())
            }
            outcome.complete = true
        }
        var failed = false
        for _ in 0..<samples {
            var stamp = voipload_realtime_ns()
            if write(sending, &stamp, 8) != 8 { failed = true; break }
            usleep(UInt32(gapMicroseconds))
        }
        if failed { shutdown(receiving, Int32(SHUT_RDWR)) }
        receiverThread.join()
        guard !failed, outcome.complete else { throw LoadError("floor relay: the relay went away") }
        return outcome.result
    }

    /// The relay (hidden subcommand `voipload floor-relay PORT`): accepts the sending and
    /// the receiving connection, then copies stamps from one to the other until either
    /// closes.
    static func relayMain(port: UInt16) -> Int32 {
        guard let listener = try? SocketCalls.listenTCP(SocketCalls.socketAddress((127 << 24) | 1, port: port), backlog: 4) else { return 1 }
        var byRole: [UInt8: Int32] = [:]
        while byRole.count < 2 {
            guard let fd = try? SocketCalls.accept(listener) else { return 1 }
            try? SocketCalls.setOption(fd, level: Int32(IPPROTO_TCP), name: TCP_NODELAY, Int32(1))
            var role: UInt8 = 0
            guard read(fd, &role, 1) == 1 else { return 1 }
            byRole[role] = fd
        }
        guard let from = byRole[1], let to = byRole[2] else { return 1 }
        var stamp: UInt64 = 0
        while readFully(from, &stamp) {
            guard write(to, &stamp, 8) == 8 else { return 0 }
        }
        return 0
    }

    private static func connectWithRetry(port: UInt16, role: UInt8) throws(LoadError) -> Int32 {
        let clock = SystemClock()
        let deadline = clock.now() + .seconds(10)
        while true {
            guard let fd = try? SocketCalls.openTCP(nonBlocking: false) else { throw LoadError("floor relay: no socket") }
            if (try? SocketCalls.connect(fd, SocketCalls.socketAddress((127 << 24) | 1, port: port))) != nil {
                try? SocketCalls.setOption(fd, level: Int32(IPPROTO_TCP), name: TCP_NODELAY, Int32(1))
                var role = role
                guard write(fd, &role, 1) == 1 else { close(fd); throw LoadError("floor relay: handshake failed") }
                return fd
            }
            close(fd)
            guard clock.now() < deadline else { throw LoadError("the floor relay did not start listening") }
            usleep(2_000)
        }
    }

    /// One 8-byte stamp and the kernel's receive timestamp of its (last) segment.
    private static func readStamp(_ fd: Int32) -> (UInt64, UInt64)? {
        var value: UInt64 = 0
        var arrivedAt: UInt64 = 0
        var received = 0
        let complete = withUnsafeMutableBytes(of: &value) { bytes in
            while received < 8 {
                var stamp: UInt64 = 0
                let count = voipload_read_stamped(fd, bytes.baseAddress! + received, UInt(8 - received), &stamp)
                if count <= 0 { return false }
                received += count
                arrivedAt = stamp
            }
            return true
        }
        return complete ? (value, arrivedAt) : nil
    }

    private static func readFully(_ fd: Int32, _ value: inout UInt64) -> Bool {
        var received = 0
        return withUnsafeMutableBytes(of: &value) { bytes in
            while received < 8 {
                let count = read(fd, bytes.baseAddress! + received, 8 - received)
                if count <= 0 { return false }
                received += count
            }
            return true
        }
    }
}
