import SignalingSupport

/// A token bucket: admits `rate` operations per second on average, with bursts up to
/// `burst`. Used to pace handshakes during a reconnect storm. Not thread-safe on its own;
/// the server keeps it behind a lock.
struct TokenBucket {
    let rate: Double
    let burst: Double
    private var tokens: Double
    private var last: Instant

    /// `rate` 0 means unlimited.
    init(rate: Double, burst: Double, now: Instant) {
        self.rate = rate
        self.burst = max(1, burst)
        self.tokens = max(1, burst)
        self.last = now
    }

    /// Takes one token if there is one.
    mutating func tryTake(now: Instant) -> Bool {
        guard rate > 0 else { return true }
        if now > last {
            tokens = min(burst, tokens + (now - last).seconds * rate)
            last = now
        }
        guard tokens >= 1 else { return false }
        tokens -= 1
        return true
    }
}
