/// Sums of worker counters, and the peak rate of a counter sampled over time.
extension WorkerStatus {
    /// The run-wide counters: every worker's added up.
    public static func total(_ statuses: some Sequence<WorkerStatus>) -> WorkerStatus {
        var total = WorkerStatus()
        total.worker = -1
        total.probesDone = true
        for s in statuses {
            total.idleConnected += s.idleConnected
            total.idleFailed += s.idleFailed
            total.sendersConnected += s.sendersConnected
            total.fanoutConnected += s.fanoutConnected
            total.inFlight += s.inFlight
            total.connectAttempts += s.connectAttempts
            total.handshakes += s.handshakes
            total.resumed += s.resumed
            total.idleHandshakes += s.idleHandshakes
            total.disconnects.merge(s.disconnects, uniquingKeysWith: +)
            total.failures.merge(s.failures, uniquingKeysWith: +)
            total.probesSent += s.probesSent
            total.probesAccepted += s.probesAccepted
            total.probesRefused += s.probesRefused
            total.probesReceived += s.probesReceived
            total.probeReceipts += s.probeReceipts
            total.callsEnded += s.callsEnded
            total.callsAnswered += s.callsAnswered
            total.pushProbesSent += s.pushProbesSent
            total.pushProbesAccepted += s.pushProbesAccepted
            total.pushProbesRefused += s.pushProbesRefused
            total.probesDone = total.probesDone && s.probesDone
            total.realtimeWorkers += s.realtimeWorkers
            total.duplicates += s.duplicates
            total.unexpectedEvents += s.unexpectedEvents
            total.unstampedEvents += s.unstampedEvents
            total.sequenceResets += s.sequenceResets
            total.tlsFullHandshakes += s.tlsFullHandshakes
            total.tlsResumedHandshakes += s.tlsResumedHandshakes
            total.fanoutSent += s.fanoutSent
            total.fanoutAccepted += s.fanoutAccepted
            total.fanoutRefused += s.fanoutRefused
            total.fanoutDelivered += s.fanoutDelivered
            total.fanoutReceipts += s.fanoutReceipts
            total.residentBytes += s.residentBytes
        }
        return total
    }
}

extension Dictionary where Key == String, Value == UInt64 {
    /// Per-key growth since `earlier` (keys that did not grow are left out).
    func growth(since earlier: [String: UInt64]) -> [String: UInt64] {
        var result: [String: UInt64] = [:]
        for (key, value) in self where value > earlier[key, default: 0] {
            result[key] = value - earlier[key, default: 0]
        }
        return result
    }

    /// "a (3), b (1)": the largest first.
    var summary: String {
        sorted { $0.value != $1.value ? $0.value > $1.value : $0.key < $1.key }
            .map { "\($0.key) (\($0.value))" }.joined(separator: ", ")
    }
}

/// Samples of a cumulative counter, giving the best rate over any window of a given length.
public struct RateTracker: Sendable {
    public private(set) var samples: [(time: Double, count: UInt64)] = []
    /// Samples closer together than this are skipped.
    public var resolution: Double

    public init(resolution: Double = 0.1) { self.resolution = resolution }

    public mutating func sample(time: Double, count: UInt64) {
        if let last = samples.last, time - last.time < resolution { return }
        samples.append((time, count))
    }

    /// The highest (count growth / time) over windows at least `window` seconds long;
    /// the overall rate when all samples span less than the window.
    public func peakRate(window: Double = 1) -> Double {
        guard let first = samples.first, let last = samples.last, last.time > first.time else { return 0 }
        if last.time - first.time < window {
            return Double(last.count &- first.count) / (last.time - first.time)
        }
        var best = 0.0
        var start = 0
        for end in samples.indices {
            while start + 1 < end && samples[end].time - samples[start + 1].time >= window { start += 1 }
            let span = samples[end].time - samples[start].time
            guard span >= window else { continue }
            best = Swift.max(best, Double(samples[end].count &- samples[start].count) / span)
        }
        return best
    }
}
