import Foundation

/// Human-readable forms of a report: the summary after a run, and the benchmark table.
extension LoadReport {
    public var summary: String {
        var lines: [String] = []
        let c = connections
        lines.append("voipload: \(setup.devices) idle devices on \(setup.server) from \(setup.workers) workers over \(setup.sourceAddresses) source addresses")
        lines.append("connections  \(c.connected) connected, \(c.failed) failed in \(format(c.rampSeconds)) s: \(Int(c.handshakesPerSecond)) handshakes/s (peak \(Int(c.peakHandshakesPerSecond))/s)")
        lines.append("             handshake \(latencyLine(c.handshakeLatency))")
        if !c.failureReasons.isEmpty { lines.append("             failures: \(c.failureReasons.summary)") }
        let m = memory
        if let perConnection = m.serverBytesPerConnection, let before = m.serverRSSBefore, let after = m.serverRSSAfter {
            lines.append("memory       server RSS \(megabytes(before)) → \(megabytes(after)): \(Int(perConnection.rounded())) B per idle connection")
        } else {
            lines.append("memory       server RSS unknown (give --server-pid or --server-bin)")
        }
        if let kernel = m.kernelBytesPerConnection, let pages = m.tcpMemoryPagesAfter {
            lines.append("             kernel TCP memory \(pages) pages: \(Int(kernel.rounded())) B per connection (both loopback ends)")
        }
        lines.append("             this tool: \(megabytes(m.toolRSS)), \(Int(m.toolBytesPerConnection.rounded())) B per connection")
        if let p = push {
            let priority = p.priority == ProbePriority.realtime.rawValue ? ", workers at SCHED_FIFO" : ""
            lines.append("push         \(p.sent) sent (\(p.mix), \(Int(p.rate))/s\(priority)), \(p.received) received, \(p.lost) lost, \(p.refused) refused, \(p.duplicates) duplicates")
            lines.append("             latency \(latencyLine(p.latency))   (send → arrival at the device's socket)")
            if let read = p.readLatency { lines.append("             read    \(latencyLine(read))   (send → read by the device)") }
            if let unstamped = p.unstampedEvents, unstamped > 0 {
                lines.append("             \(unstamped) events came without a kernel receive timestamp: their arrival is their read")
            }
            if let cpu = p.serverCPUMicrosPerProbe { lines.append("             server CPU \(format(cpu)) µs per probe (whole exchange)") }
            if p.messageLatency.count > 0 { lines.append("             message \(latencyLine(p.messageLatency))") }
            if p.callLatency.count > 0 { lines.append("             call    \(latencyLine(p.callLatency))") }
        }
        if let f = fanout {
            let perCore = f.eventsPerCPUSecond.map { "\(Int($0)) events/s per core (server CPU \(format(f.serverCPUSeconds ?? 0)) s)" } ?? "server CPU unknown"
            lines.append("fan-out      \(f.messages) messages × \(f.devices) devices in \(format(f.seconds)) s: \(f.delivered) delivered + \(f.receipts) receipts, \(f.lost) lost")
            lines.append("             \(Int(f.eventsPerSecond)) events/s, \(perCore)")
            lines.append("             latency \(latencyLine(f.latency))")
        }
        if let s = storm {
            let down = s.serverDownSeconds.map { ", server back after \(format($0)) s" } ?? ""
            lines.append("storm        \(s.kind): \(s.recovered ? "all \(s.devices) back" : "NOT all back") after \(format(s.recoverySeconds)) s\(down); \(s.handshakes) handshakes (\(s.resumed) resumed), peak \(Int(s.peakHandshakesPerSecond))/s")
            if !s.disconnectReasons.isEmpty { lines.append("             \(s.disconnectReasons.summary)") }
        }
        lines.append(problems.isEmpty ? "result       PASS" : "result       FAIL: " + problems.joined(separator: "; "))
        return lines.joined(separator: "\n") + "\n"
    }

    public var json: String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        return (try? String(decoding: encoder.encode(self), as: UTF8.self)) ?? "{}"
    }

    /// The benchmark table: one row per report, sizes ascending.
    public static func table(_ reports: [LoadReport]) -> String {
        let header = ["devices", "B/conn", "kernel B/conn", "p50 µs", "p90 µs", "p99 µs", "p99.9 µs", "max µs",
                      "read p50 µs", "read p99 µs", "handshakes/s", "fan-out ev/s/core", "storm s", "storm peak/s", "result"]
        var rows = [header]
        for r in reports.sorted(by: { $0.setup.devices < $1.setup.devices }) {
            rows.append([
                "\(r.setup.devices)",
                r.memory.serverBytesPerConnection.map { "\(Int($0.rounded()))" } ?? "-",
                r.memory.kernelBytesPerConnection.map { "\(Int($0.rounded()))" } ?? "-",
                r.push.map { format($0.latency.p50) } ?? "-",
                r.push.map { format($0.latency.p90) } ?? "-",
                r.push.map { format($0.latency.p99) } ?? "-",
                r.push.map { format($0.latency.p999) } ?? "-",
                r.push.map { format($0.latency.max) } ?? "-",
                r.push?.readLatency.map { format($0.p50) } ?? "-",
                r.push?.readLatency.map { format($0.p99) } ?? "-",
                "\(Int(r.connections.handshakesPerSecond))",
                r.fanout?.eventsPerCPUSecond.map { "\(Int($0))" } ?? "-",
                r.storm.map { format($0.recoverySeconds) } ?? "-",
                r.storm.map { "\(Int($0.peakHandshakesPerSecond))" } ?? "-",
                r.passed ? "PASS" : "FAIL",
            ])
        }
        let widths = header.indices.map { column in rows.map { $0[column].count }.max() ?? 0 }
        return rows.map { row in
            zip(row, widths).map { cell, width in String(repeating: " ", count: width - cell.count) + cell }
                .joined(separator: "  ")
        }.joined(separator: "\n") + "\n"
    }
}

func format(_ value: Double) -> String {
    value >= 100 ? String(Int(value.rounded())) : String(format: "%.1f", value)
}

func megabytes(_ bytes: UInt64) -> String { String(format: "%.1f MB", Double(bytes) / 1_048_576) }

func latencyLine(_ l: LoadReport.Latency) -> String {
    guard l.count > 0 else { return "(none)" }
    return "p50 \(format(l.p50)) µs, p90 \(format(l.p90)), p99 \(format(l.p99)), p99.9 \(format(l.p999)), max \(format(l.max)) (\(l.count) samples)"
}
