/// What one side's probe measured: the figures printed after a call and put in `--json`.
///
/// - loss: requests whose echo did not come back before the probe's deadline (a round
///   trip: a loss in either direction counts);
/// - round-trip time: from sending a request to receiving its echo (min, mean, max);
/// - jitter: the RFC 3550 §6.4.1 interarrival jitter estimator with the round-trip time
///   standing in for the one-way transit time (which needs synchronised clocks):
///   J += (|RTTᵢ − RTTᵢ₋₁| − J) / 16, over the echoes in the order they arrived.
public struct ProbeStatistics: Sendable, Equatable {
    public var sent: Int
    public var received: Int
    public var minimumRoundTrip: Duration?
    public var averageRoundTrip: Duration?
    public var maximumRoundTrip: Duration?
    public var jitter: Duration?

    public var lossPercent: Double {
        sent == 0 ? 0 : Double(sent - received) * 100 / Double(sent)
    }

    /// Computes the figures from the round trips of the echoes received, in arrival order.
    public init(sent: Int, roundTrips: [Duration]) {
        self.sent = sent
        received = roundTrips.count
        guard !roundTrips.isEmpty else { return }
        let nanoseconds = roundTrips.map { Double($0.seconds * 1e9) }
        minimumRoundTrip = roundTrips.min()
        maximumRoundTrip = roundTrips.max()
        averageRoundTrip = .nanoseconds(Int64(nanoseconds.reduce(0, +) / Double(nanoseconds.count)))
        var estimate = 0.0
        for (previous, current) in zip(nanoseconds, nanoseconds.dropFirst()) {
            estimate += (abs(current - previous) - estimate) / 16
        }
        jitter = .nanoseconds(Int64(estimate))
    }
}

/// Whether a probe result passes `--require-media` / `--max-loss`.
public enum ProbeVerdict {
    /// `--require-media` alone: fail only when nothing came back.
    public static let anythingButTotalLoss = 99.999

    /// Nil when it passes; otherwise why not.
    public static func failure(of statistics: ProbeStatistics?, maximumLossPercent: Double) -> String? {
        guard let statistics else { return "no media probe result (the peer announced no probe address, or the call ended first)" }
        if statistics.received == 0 { return "no probe packet came back (\(statistics.sent) sent)" }
        if statistics.lossPercent > maximumLossPercent {
            return "probe loss \(Format.percent(statistics.lossPercent)) % is over --max-loss \(Format.percent(maximumLossPercent)) %"
        }
        return nil
    }
}
