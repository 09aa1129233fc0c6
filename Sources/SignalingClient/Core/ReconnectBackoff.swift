import SignalingProtocol

/// The back-off state of one client: how many attempts failed in a row.
struct ReconnectBackoff {
    let policy: ReconnectPolicy
    /// Consecutive failed attempts (0 after a stable connection).
    private(set) var attempt = 0

    init(policy: ReconnectPolicy) { self.policy = policy }

    /// The delay before the next attempt (full jitter), and counts the attempt.
    mutating func nextDelay(using generator: inout some RandomNumberGenerator) -> Duration {
        let ceiling = policy.ceiling(forAttempt: attempt)
        attempt += 1
        let nanoseconds = ceiling.components.seconds * 1_000_000_000 + ceiling.components.attoseconds / 1_000_000_000
        guard nanoseconds > 0 else { return .zero }
        return .nanoseconds(Int64.random(in: 0...nanoseconds, using: &generator))
    }

    /// The delay a CLOSE frame asks for: `retryAfterMs` plus a uniform 0...`retryJitterMs`.
    static func advisedDelay(for close: Close, using generator: inout some RandomNumberGenerator) -> Duration {
        let jitter = close.retryJitterMs == 0 ? 0 : UInt32.random(in: 0...close.retryJitterMs, using: &generator)
        return .milliseconds(Int64(close.retryAfterMs) + Int64(jitter))
    }

    /// The wait after a rejected certificate: uniform in the upper half of the policy's
    /// `certificateFailureDelay`, so devices spread out but none retries early.
    func certificateFailureDelay(using generator: inout some RandomNumberGenerator) -> Duration {
        let delay = policy.certificateFailureDelay
        let nanoseconds = delay.components.seconds * 1_000_000_000 + delay.components.attoseconds / 1_000_000_000
        guard nanoseconds > 1 else { return delay }
        return .nanoseconds(Int64.random(in: nanoseconds / 2...nanoseconds, using: &generator))
    }

    mutating func reset() { attempt = 0 }
}
