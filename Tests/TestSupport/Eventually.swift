import SignalingSupport

/// Waits, on the real clock, until `condition` holds or `seconds` have passed, looking
/// every 2 ms; returns whether it held. For conditions another thread makes true (a lease
/// thread, a link's thread); a test on a manual clock moves that clock itself instead.
public func eventually(_ seconds: Double = 10, _ condition: () -> Bool) -> Bool {
    let real = SystemClock()
    let deadline = real.now() + .milliseconds(Int64(seconds * 1000))
    while real.now() < deadline {
        if condition() { return true }
        real.sleep(until: real.now() + .milliseconds(2))
    }
    return condition()
}
