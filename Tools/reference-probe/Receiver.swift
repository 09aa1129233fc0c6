import VoipLoadKit
import SignalingSupport

/// The receiver thread: one epoll loop over every subscriber connection. Each event's
/// latency is the monotonic time right after the recv(2) that brought it minus the send
/// stamp in its payload. Stops once every sent event has arrived, or `lossTimeout` after
/// the last send.
struct Receiver {
    var table: SubscriberTable
    var board: ProgressBoard
    var lossTimeoutNanoseconds: UInt64

    struct Outcome: Sendable {
        var latency = LatencyHistogram()
        var received = 0
        var misrouted = 0
        /// Subscriber connections that failed during the measurement.
        var connectionsLost = 0
        var firstProblem: String?
        var stampsFromTheFuture = 0
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
                case .received(let now):
                    for stamp in inbound.stamps {
                        if stamp <= now {
                            outcome.latency.record(nanoseconds: now - stamp)
                        } else {
                            outcome.stampsFromTheFuture += 1
                        }
                    }
                    outcome.received += inbound.stamps.count
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
