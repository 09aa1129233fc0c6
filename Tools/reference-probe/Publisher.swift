import CLinuxShims
import VoipLoadKit
import SignalingSupport
#if canImport(Glibc)
import Glibc
#endif

/// The publisher thread: open loop, or closed loop. Open loop, event k is due at start +
/// k / rate; closed loop, it is due once event k - 1 has arrived at its subscriber (the
/// receiver says so through the board; after the loss timeout it goes anyway). The thread
/// sleeps until then, reads (without waiting) and handles what the server sent it since the last
/// send (OK/ERROR replies, and delivery receipts, which it acknowledges (voip)), then stamps
/// the payload with the time (CLOCK_REALTIME) and sends at once, whatever has or has not
/// arrived.
struct Publisher {
    var fd: Int32
    var dialect: any Dialect
    var subscribers: Int
    var events: Int
    /// The number of the first event (each event's number is unique over the probe's
    /// turns: voip makes it the message id, which the server would take for a retry).
    var firstNumber = 0
    var rate: Double
    /// Send each event once the previous one arrived, not at `rate`.
    var closedLoop: Bool
    var payloadBytes: Int
    var seed: UInt64
    var board: ProgressBoard
    /// How long to wait for outstanding replies after the last send (voip).
    var replyTimeoutNanoseconds: UInt64
    /// Closed loop: how long to wait for an event's arrival before sending the next anyway.
    var lossTimeoutNanoseconds: UInt64

    struct Outcome: Sendable {
        var sent = 0
        var seconds = 0.0
        /// How late the sends were against their due times (scheduling, blocking sends).
        var lateness = LatencyHistogram()
        var oks = 0
        var errors = 0
        var lastError: String?
        var problem: String?
        var achievedRate: Double { seconds > 0 ? Double(max(0, sent - 1)) / seconds : 0 }

        /// Adds a later turn's outcome (`--turns`): its sends, time and replies.
        mutating func add(_ turn: Outcome) {
            sent += turn.sent
            seconds += turn.seconds
            lateness.merge(turn.lateness)
            oks += turn.oks
            errors += turn.errors
            lastError = turn.lastError ?? lastError
            problem = problem ?? turn.problem
        }
    }

    func run(expectsReplies: Bool) -> Outcome {
        let clock = SystemClock()
        var outcome = Outcome()
        var random = FastRandom(seed: seed)
        var inbound = Inbound()
        var pending = PartialInput()
        let scratch = UnsafeMutableRawBufferPointer.allocate(byteCount: 64 * 1024, alignment: 8)
        defer { scratch.deallocate() }
        let payload = [UInt8](repeating: 0, count: payloadBytes)
        let interval = 1e9 / rate
        let start = clock.now().nanoseconds + 10_000_000
        var firstSend: UInt64 = 0

        /// Reads what has arrived without waiting; false when the connection is unusable.
        func drainReplies() -> Bool {
            while true {
                let count: Int
                switch SocketCalls.receive(fd, into: scratch, flags: Int32(MSG_DONTWAIT)) {
                case .transferred(let moved) where moved > 0: count = moved
                case .transferred:
                    outcome.problem = "the server closed the publisher's connection"
                    return false
                case .wouldBlock: return true
                case .failed(let code):
                    outcome.problem = ProbeError(call: "recv", code: code).message
                    return false
                }
                inbound.reset()
                pending.consume(UnsafeRawBufferPointer(rebasing: scratch[0..<count]), dialect: dialect, subscriber: nil, into: &inbound)
                outcome.oks += inbound.oks
                outcome.errors += inbound.errors
                if let error = inbound.lastError { outcome.lastError = error }
                if let problem = inbound.problem { outcome.problem = problem; return false }
                if !inbound.reply.isEmpty && !Sockets.sendAll(fd, inbound.reply) {
                    outcome.problem = ProbeError(call: "send").message
                    return false
                }
            }
        }

        for number in 0..<events {
            var due = start + UInt64(Double(number) * interval)
            if closedLoop {
                if number == 0 {
                    clock.sleep(until: Instant(nanoseconds: start))
                } else {
                    _ = board.waitForArrivals(number, deadline: clock.now().nanoseconds + lossTimeoutNanoseconds, clock: clock)
                }
                due = clock.now().nanoseconds
            } else {
                clock.sleep(until: Instant(nanoseconds: due))
            }
            // The thread's own work (replies, receipts and their ACKs, the next packet) comes
            // before the send, never after it: a server thread woken by the send is often
            // placed on this thread's CPU and waits until this thread sleeps again. Reading
            // the voip replies after the send (an ACK's write included, ~12 µs) made
            // voipserver pay that wait where Mosquitto, whose QoS 0 publisher has nothing to
            // read, did not.
            guard drainReplies() else { break }
            var packet = dialect.publication(number: firstNumber + number, subscriber: random.below(subscribers), payload: payload)
            let stampOffset = packet.count - payloadBytes
            let sent = packet.withUnsafeMutableBytes { bytes in
                // The payload carries CLOCK_REALTIME: the clock of the kernel's receive
                // timestamps. Pacing and the loss timeout stay on the monotonic clock.
                let stamp = clock.now().nanoseconds
                bytes.storeBytes(of: voipload_realtime_ns().littleEndian, toByteOffset: stampOffset, as: UInt64.self)
                let ok = Sockets.sendAll(fd, UnsafeRawBufferPointer(bytes))
                board.lastSendNanoseconds.store(stamp, ordering: .releasing)
                return ok ? stamp : nil
            }
            guard let stamp = sent else {
                outcome.problem = ProbeError(call: "send").message
                break
            }
            if number == 0 { firstSend = stamp }
            outcome.lateness.record(nanoseconds: stamp > due ? stamp - due : 0)
            outcome.sent += 1
            board.sent.store(outcome.sent, ordering: .releasing)
            outcome.seconds = Double(stamp - firstSend) / 1e9
        }
        board.finished.store(true, ordering: .releasing)

        // Collect the outstanding replies (and acknowledge the receipts still coming).
        if expectsReplies && outcome.problem == nil {
            let deadline = clock.now().nanoseconds + replyTimeoutNanoseconds
            while outcome.oks + outcome.errors < outcome.sent && clock.now().nanoseconds < deadline {
                usleep(1_000)
                guard drainReplies() else { break }
            }
        }
        return outcome
    }
}
