import SignalingSupport
import VoipLoadKit
/// The probe's printed result: a readable block, then one `SUMMARY` line of key=value pairs
/// for scripts (Tools/bench-reference collects them into a table).
struct ProbeReport {
    var options: ProbeOptions
    var connect: SubscriberConnector.Outcome
    var rssBefore: UInt64?
    var rssAfter: UInt64?
    var publisher: Publisher.Outcome
    var receiver: Receiver.Outcome
    var cpu: CPUAccounting.Usage

    var lost: Int { max(0, publisher.sent - receiver.received) }

    var rssPerConnection: Double? {
        guard let before = rssBefore, let after = rssAfter, connect.established > 0 else { return nil }
        return (Double(after) - Double(before)) / Double(connect.established)
    }

    /// Everything arrived, nothing failed.
    var clean: Bool {
        connect.failed == 0 && lost == 0 && publisher.problem == nil && publisher.errors == 0
            && publisher.sent == options.events && receiver.connectionsLost == 0 && receiver.misrouted == 0
            && receiver.stampsFromTheFuture == 0
    }

    private func percentiles(_ histogram: LatencyHistogram) -> String {
        "p50 \(micro(histogram.value(atPercentile: 50)))  p90 \(micro(histogram.value(atPercentile: 90)))  "
            + "p99 \(micro(histogram.value(atPercentile: 99)))  p99.9 \(micro(histogram.value(atPercentile: 99.9)))  "
            + "max \(micro(histogram.maximum))  mean \(fixed(histogram.mean / 1000, 1))  (n=\(histogram.totalCount))"
    }

    func text() -> String {
        let latency = receiver.latency
        var lines: [String] = []
        lines.append("protocol        \(options.wireProtocol.rawValue), server \(SocketCalls.dottedQuad(options.server.address)):\(options.server.port)")
        if options.publisherServer != options.server {
            lines.append("publisher       on \(SocketCalls.dottedQuad(options.publisherServer.address)):\(options.publisherServer.port)")
        }
        lines.append("subscribers     \(connect.established) connected, \(connect.failed) failed, \(connect.retries) retried attempts, "
            + "in \(fixed(connect.seconds, 2)) s: \(fixed(connect.handshakesPerSecond, 0)) handshakes/s")
        if let first = connect.firstFailure { lines.append("                first failure: \(first)") }
        if let overflows = connect.listenOverflows, overflows > 0 {
            lines.append("                \(overflows) SYNs dropped by the kernel on a full accept queue (each costs a 1 s retransmit): "
                + "the ramp was paced above the server's listen backlog (--max-in-flight \(options.maxInFlight))")
        }
        if let before = rssBefore, let after = rssAfter, let perConnection = rssPerConnection {
            lines.append("server RSS      \(mebibytes(before)) before, \(mebibytes(after)) with the subscribers: "
                + "\(fixed(perConnection, 0)) bytes per connection")
        } else if options.serverPID != nil {
            lines.append("server RSS      not readable")
        }
        lines.append("events          \(publisher.sent) sent in \(fixed(publisher.seconds, 2)) s (\(fixed(publisher.achievedRate, 0))/s), "
            + "\(receiver.received) received, \(lost) lost, \(receiver.misrouted) misrouted"
            + (options.closedLoop ? " (closed loop: each sent once the previous arrived)" : ""))
        lines.append("send lateness   p50 \(micro(publisher.lateness.value(atPercentile: 50))) µs, "
            + "p99 \(micro(publisher.lateness.value(atPercentile: 99))) µs, max \(micro(publisher.lateness.maximum)) µs (against the schedule)")
        if options.wireProtocol == .voip {
            lines.append("replies         \(publisher.oks) OK, \(publisher.errors) ERROR" + (publisher.lastError.map { " (last: \($0))" } ?? ""))
        }
        if let problem = publisher.problem { lines.append("publisher       \(problem)") }
        if receiver.connectionsLost > 0 {
            lines.append("receiver        \(receiver.connectionsLost) subscriber connections failed; first: \(receiver.firstProblem ?? "?")")
        }
        if receiver.stampsFromTheFuture > 0 { lines.append("receiver        \(receiver.stampsFromTheFuture) stamps later than their arrival") }
        lines.append("latency (µs)    send to arrival at the subscriber's socket (kernel receive timestamp):")
        lines.append("                " + percentiles(latency))
        lines.append("                send to read by the subscriber (adds its wake-up and recv):")
        lines.append("                " + percentiles(receiver.readLatency))
        if receiver.unstamped > 0 {
            lines.append("receiver        \(receiver.unstamped) events came without a kernel receive timestamp: their arrival is their read")
        }
        lines.append("CPU (% of a core) while measuring: server \(cpu.server.map { fixed($0, 1) } ?? "?"), probe \(fixed(cpu.probe, 1)), "
            + "irq+softirq \(fixed(cpu.interrupts, 1)), steal \(fixed(cpu.steal, 1)), other processes \(fixed(cpu.others, 1))")
        if cpu.others > 10 {
            lines.append("                other processes used the cores meanwhile: the tails are not the servers' alone")
        }
        lines.append(summary())
        lines.append(clean ? "result          OK" : "result          FAILED")
        return lines.joined(separator: "\n") + "\n"
    }

    func summary() -> String {
        let latency = receiver.latency
        let pairs: [(String, String)] = [
            ("protocol", options.wireProtocol.rawValue),
            ("pacing", options.closedLoop ? "closed" : fixed(options.rate, 0)),
            ("subscribers", "\(connect.established)"),
            ("failed", "\(connect.failed)"),
            ("handshakes_per_s", fixed(connect.handshakesPerSecond, 0)),
            ("listen_overflows", connect.listenOverflows.map { "\($0)" } ?? "-"),
            ("rss_bytes_per_conn", rssPerConnection.map { fixed($0, 0) } ?? "-"),
            ("p50_us", micro(latency.value(atPercentile: 50))),
            ("p90_us", micro(latency.value(atPercentile: 90))),
            ("p99_us", micro(latency.value(atPercentile: 99))),
            ("p999_us", micro(latency.value(atPercentile: 99.9))),
            ("max_us", micro(latency.maximum)),
            ("samples", "\(latency.totalCount)"),
            ("read_p50_us", micro(receiver.readLatency.value(atPercentile: 50))),
            ("read_p99_us", micro(receiver.readLatency.value(atPercentile: 99))),
            ("lost", "\(lost)"),
            ("server_cpu_pct", cpu.server.map { fixed($0, 1) } ?? "-"),
            ("other_cpu_pct", fixed(cpu.others, 1)),
            ("steal_pct", fixed(cpu.steal, 1)),
        ]
        return "SUMMARY " + pairs.map { "\($0.0)=\($0.1)" }.joined(separator: " ")
    }

    private func micro(_ nanoseconds: UInt64) -> String {
        let value = Double(nanoseconds) / 1000
        return fixed(value, value < 100 ? 1 : 0)
    }

    private func mebibytes(_ bytes: UInt64) -> String { fixed(Double(bytes) / 1_048_576, 1) + " MiB" }
}

/// `value` with `decimals` digits after the point (no Foundation).
func fixed(_ value: Double, _ decimals: Int) -> String {
    guard value.isFinite else { return "\(value)" }
    var scale = 1.0
    for _ in 0..<decimals { scale *= 10 }
    let scaled = (abs(value) * scale).rounded()
    let whole = Int(scaled / scale)
    let fraction = Int(scaled - Double(whole) * scale)
    let sign = value < 0 && scaled != 0 ? "-" : ""
    guard decimals > 0 else { return "\(sign)\(whole)" }
    let digits = String(fraction)
    return "\(sign)\(whole)." + String(repeating: "0", count: decimals - digits.count) + digits
}
