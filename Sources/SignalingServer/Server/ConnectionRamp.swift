import SignalingSupport

/// Whether devices are connecting in a ramp (a restart's reconnections, a load test's
/// setup) rather than at a deployment's steady trickle: handshakes completed since the
/// previous look at `rampHandshakesPerSecond` or more. Loop 0 looks once per tick and hands
/// the answer to both supervisors that give way to a ramp (`StoreThreadPriority`,
/// `LoopRealtimeSupervision`), so they agree on what a ramp is.
struct ConnectionRamp: Sendable {
    /// Handshakes a second that make a ramp: far above a deployment's steady reconnections,
    /// far below a ramp's thousands.
    static let rampHandshakesPerSecond = 200.0

    /// The handshake count at the previous look, and when.
    private var last: (count: Int, at: Instant)?
    /// The answer of the last look at which the clock had moved.
    private var ramping = false

    /// Loop 0's tick: `handshakes` completed so far, at `now`. Judged again only once the
    /// clock has moved (a manual clock may stand still between ticks).
    mutating func observe(handshakes: Int, now: Instant) -> Bool {
        guard let last else {
            self.last = (handshakes, now)
            return ramping
        }
        if now > last.at {
            ramping = Double(handshakes - last.count) / (now - last.at).seconds >= Self.rampHandshakesPerSecond
            self.last = (handshakes, now)
        }
        return ramping
    }
}
