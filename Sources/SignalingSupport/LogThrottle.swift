/// Lets at most one line of a kind through per second and counts the rest, so that a flood
/// of the same condition (refused senders, failed logins) cannot flood the log while the
/// operator still sees that it happens and how often.
///
/// Not synchronised: each event loop keeps its own.
public struct LogThrottle: Sendable {
    private var nextSecond: UInt32 = 0
    private var suppressed = 0

    public init() {}

    /// Call when the condition happens at `second` (any monotonic second count). Returns
    /// nil when the line must be dropped, else how many were dropped since the last one let
    /// through (to be logged with it).
    public mutating func admit(atSecond second: UInt32) -> Int? {
        guard second >= nextSecond else {
            suppressed += 1
            return nil
        }
        nextSecond = second &+ 1
        defer { suppressed = 0 }
        return suppressed
    }
}
