import VoipLoadKit
import SignalingSupport

/// The receiver thread: one epoll loop over every subscriber connection. Each event has
/// two latencies, both from the send stamp in its payload:
/// - arrival: to the kernel's receive timestamp of the bytes on the subscriber's socket
///   (SO_TIMESTAMPNS), the moment the server's write reached the device. This is the
///   server's push latency; it does not include how long the device takes to wake up.
/// - read: to right after the recv(2) that brought it, which adds the wake-up of this
///   thread (an idle device) and the read itself.
/// For TCP the kernel stamps a read with its last segment, so an event that shared a
/// read with a later one is given the later arrival (never an earlier one).
/// Stops once every sent event has arrived, or `lossTimeout` after the last send.
struct Receiver {
    var table: SubscriberTable
    var board: ProgressBoard
    var lossTimeoutNanoseconds: UInt64
    /// Closed-loop: tell the publisher about every arrival (`ProgressBoard.arrived`).
    var reportsArrivals: Bool

    struct Outcome: Sendable {
        /// Send stamp to the kernel's receive timestamp.
        var latency = LatencyHistogram()
        /// Send stamp to this thread having read the event.
        var readLatency = LatencyHistogram()
        /// Events read without a kernel receive timestamp: their arrival is their read.
        var unstamped = 0
        var received = 0
        var misrouted = 0
        /// Subscriber connections that failed during the measurement.
        var connectionsLost = 0
        var firstProblem: String?
        var stampsFromTheFuture = 0

        /// Adds a later turn's outcome (`--turns`).
        mutating func add(_ turn: Outcome) {
            latency.merge(turn.latency)
            readLatency.merge(turn.readLatency)
            unstamped += turn.unstamped
            received += turn.received
            misrouted += turn.misrouted
            connectionsLost += turn.connectionsLost
            firstProblem = firstProblem ?? turn.firstProblem
            stampsFromTheFuture += turn.stampsFromTheFuture
        }
    }

    func run() -> Outcome {
        var outcome = Outcome()
        var inbound = Inbound()
        while true {
            table.epoll.wait(timeoutMilliseconds: 20) { token, _ in
                let index = Int(token)
                switch table.read(index, into: &inbound) {
                case .nothing:
                    break
                case .failed(let reason):
                    table.drop(index)
                    outcome.connectionsLost += 1
                    if outcome.firstProblem == nil { outcome.firstProblem = "subscriber \(index): \(reason)" }
                case .received(let arrived, let read):
                    for stamp in inbound.stamps {
                        guard stamp <= read else {
                            outcome.stampsFromTheFuture += 1
                            continue
                        }
                        outcome.readLatency.record(nanoseconds: read - stamp)
                        if arrived == 0 { outcome.unstamped += 1 }
                        let arrival = arrived == 0 ? read : arrived
                        // A stamp a hair after the arrival is the two clocks' reading
                        // granularity, not a time machine: count it as zero.
                        outcome.latency.record(nanoseconds: arrival > stamp ? arrival - stamp : 0)
                    }
                    outcome.received += inbound.stamps.count
                    if reportsArrivals && !inbound.stamps.isEmpty { board.arrived(inbound.stamps.count) }
                    outcome.misrouted += inbound.misrouted
                }
            }
            guard board.finished.load(ordering: .acquiring) else { continue }
            if outcome.received >= board.sent.load(ordering: .acquiring) { break }
            let now = table.clock.now().nanoseconds
            if now > board.lastSendNanoseconds.load(ordering: .acquiring) + lossTimeoutNanoseconds { break }
        }
        return outcome
    }
}
