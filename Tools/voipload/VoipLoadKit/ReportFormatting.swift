import Foundation

/// Human-readable forms of a report: the summary after a run, and the benchmark table.
extension LoadReport {
    public var summary: String {
        var lines: [String] = []
        let c = connections
        lines.append("voipload: \(setup.devices) idle devices on \(setup.server) from \(setup.workers) workers over \(setup.sourceAddresses) source addresses")
        lines.append("connections  \(c.connected) connected, \(c.failed) failed in \(format(c.rampSeconds)) s: \(Int(c.handshakesPerSecond)) handshakes/s (peak \(Int(c.peakHandshakesPerSecond))/s)")
        lines.append("             handshake \(latencyLine(c.handshakeLatency))")
        if let perCore = c.handshakesPerServerCPUSecond, let cpu = c.rampServerCPUSeconds {
            lines.append("             \(Int(perCore)) connections per server CPU second (\(format(cpu)) s of server CPU for the ramp)")
        }
        if let t = tls {
            lines.append("tls          \(t.fullHandshakes) full + \(t.resumedHandshakes) resumed handshakes; TLS \(latencyLine(t.handshakeLatency))")
        }
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
            if let answered = p.callsAnswered { lines.append("             \(answered) calls rung, accepted and hung up") }
            if let pushed = p.pushProbes {
                lines.append("             \(pushed) more to devices with no connection (push wake-ups), \(p.pushProbesRefused ?? 0) refused")
            }
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
            if let full = s.tlsFullHandshakes, let resumed = s.tlsResumedHandshakes {
                lines.append("             TLS: \(full) full, \(resumed) resumed handshakes")
            }
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

    /// A column of the benchmark table: its header, and how a report's figure is read
    /// (nil: the report has none) and written.
    struct TableColumn: Sendable {
        let header: String
        let value: @Sendable (LoadReport) -> Double?
        /// Whole numbers (rates, bytes); otherwise `format`.
        var integer = false
    }

    static let tableColumns: [TableColumn] = [
        TableColumn(header: "B/conn", value: { $0.memory.serverBytesPerConnection }, integer: true),
        TableColumn(header: "kernel B/conn", value: { $0.memory.kernelBytesPerConnection }, integer: true),
        TableColumn(header: "p50 µs", value: { $0.push?.latency.p50 }),
        TableColumn(header: "p90 µs", value: { $0.push?.latency.p90 }),
        TableColumn(header: "p99 µs", value: { $0.push?.latency.p99 }),
        TableColumn(header: "p99.9 µs", value: { $0.push?.latency.p999 }),
        TableColumn(header: "max µs", value: { $0.push?.latency.max }),
        TableColumn(header: "read p50 µs", value: { $0.push?.readLatency?.p50 }),
        TableColumn(header: "read p99 µs", value: { $0.push?.readLatency?.p99 }),
        TableColumn(header: "handshakes/s", value: { $0.connections.handshakesPerSecond }, integer: true),
        TableColumn(header: "fan-out ev/s/core", value: { $0.fanout?.eventsPerCPUSecond }, integer: true),
        TableColumn(header: "storm s", value: { $0.storm?.recoverySeconds }),
        TableColumn(header: "storm peak/s", value: { $0.storm?.peakHandshakesPerSecond }, integer: true),
    ]

    /// The benchmark table: one row per report, sizes ascending (reports of one size in
    /// the order given). When some size has several reports (`BENCH_ROUNDS`), a second
    /// table follows with each column's median per size: on a noisy machine one run per
    /// size says little about how a figure grows with size.
    public static func table(_ reports: [LoadReport]) -> String {
        let sorted = reports.enumerated()
            .sorted { ($0.element.setup.devices, $0.offset) < ($1.element.setup.devices, $1.offset) }
            .map(\.element)
        var text = layout(sorted.map { report in
            ["\(report.setup.devices)"] + tableColumns.map { cell($0.value(report), $0) } + [report.passed ? "PASS" : "FAIL"]
        })
        let sizes = Dictionary(grouping: sorted, by: \.setup.devices)
        if sizes.values.contains(where: { $0.count > 1 }) {
            text += "\nmedian per size:\n" + layout(sizes.keys.sorted().map { devices in
                let group = sizes[devices]!
                let passed = group.filter(\.passed).count
                return ["\(devices)"] + tableColumns.map { column in cell(median(group.compactMap(column.value)), column) }
                    + ["\(passed)/\(group.count) PASS"]
            }, runs: true)
        }
        return text
    }

    /// The middle value (the mean of the two middle ones for an even count); nil for none.
    static func median(_ values: [Double]) -> Double? {
        guard !values.isEmpty else { return nil }
        let sorted = values.sorted()
        let middle = sorted.count / 2
        return sorted.count % 2 == 1 ? sorted[middle] : (sorted[middle - 1] + sorted[middle]) / 2
    }

    private static func cell(_ value: Double?, _ column: TableColumn) -> String {
        guard let value else { return "-" }
        return column.integer ? "\(Int(value.rounded()))" : format(value)
    }

    /// Right-aligned columns under the header.
    private static func layout(_ body: [[String]], runs: Bool = false) -> String {
        let header = ["devices"] + tableColumns.map(\.header) + [runs ? "runs" : "result"]
        let rows = [header] + body
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
