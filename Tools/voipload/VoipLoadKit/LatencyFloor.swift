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
/// server can push faster than this floor.
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

    /// Measures `samples` stamps, `gapMicroseconds` apart.
    static func measure(samples: Int, gapMicroseconds: Int, receiver: Receiver) throws(LoadError) -> LatencyHistogram {
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

        let clock = SystemClock()
        if receiver == .idleReceiver {
            return try measureWithIdleReceiver(
                samples: samples, gapMicroseconds: gapMicroseconds, sending: sending, receiving: receiving)
        }
        var histogram = LatencyHistogram()
        for _ in 0..<samples {
            var stamp = clock.now().nanoseconds
            guard write(sending, &stamp, 8) == 8 else { throw LoadError("floor relay: write failed") }
            var echoed: UInt64 = 0
            guard readFully(receiving, &echoed) else { throw LoadError("floor relay: the relay went away") }
            histogram.record(nanoseconds: clock.now().nanoseconds - echoed)
            usleep(UInt32(gapMicroseconds))
        }
        return histogram
    }

    private static func measureWithIdleReceiver(
        samples: Int, gapMicroseconds: Int, sending: Int32, receiving: Int32
    ) throws(LoadError) -> LatencyHistogram {
        final class Result: @unchecked Sendable {
            var histogram = LatencyHistogram()
            var complete = false
        }
        let result = Result()
        let receiverThread = JoinableThread {
            let clock = SystemClock()
            for _ in 0..<samples {
                var echoed: UInt64 = 0
                guard readFully(receiving, &echoed) else { return }
                result.histogram.record(nanoseconds: clock.now().nanoseconds - echoed)
            }
            result.complete = true
        }
        let clock = SystemClock()
        var failed = false
        for _ in 0..<samples {
            var stamp = clock.now().nanoseconds
            if write(sending, &stamp, 8) != 8 { failed = true; break }
            usleep(UInt32(gapMicroseconds))
        }
        if failed { shutdown(receiving, Int32(SHUT_RDWR)) }
        receiverThread.join()
        guard !failed, result.complete else { throw LoadError("floor relay: the relay went away") }
        return result.histogram
    }

    /// The relay (hidden subcommand `voipload floor-relay PORT`): accepts the sending and
    /// the receiving connection, then copies stamps from one to the other until either
    /// closes.
    static func relayMain(port: UInt16) -> Int32 {
        let listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var yes: Int32 = 1
        setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &yes, socklen_t(MemoryLayout<Int32>.size))
        var address = SocketCalls.socketAddress((127 << 24) | 1, port: port)
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(listener, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard bound == 0, listen(listener, 4) == 0 else { return 1 }
        var byRole: [UInt8: Int32] = [:]
        while byRole.count < 2 {
            let fd = accept(listener, nil, nil)
            guard fd >= 0 else { return 1 }
            setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &yes, socklen_t(MemoryLayout<Int32>.size))
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
            let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            var address = SocketCalls.socketAddress((127 << 24) | 1, port: port)
            let connected = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
            if connected == 0 {
                var yes: Int32 = 1
                setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &yes, socklen_t(MemoryLayout<Int32>.size))
                var role = role
                guard write(fd, &role, 1) == 1 else { close(fd); throw LoadError("floor relay: handshake failed") }
                return fd
            }
            close(fd)
            guard clock.now() < deadline else { throw LoadError("the floor relay did not start listening") }
            usleep(2_000)
        }
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
