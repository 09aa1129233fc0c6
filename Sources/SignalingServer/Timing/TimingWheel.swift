/// A hashed timing wheel with one-second slots and lazy re-arming.
///
/// Each connection is entered once, at its current deadline. Activity on the connection
/// does **not** touch the wheel: when the connection's slot comes round, the owner looks
/// at the connection's real deadline (e.g. last activity + idle timeout) and either expires
/// it or enters it again further ahead. So an idle connection costs one wheel visit per
/// timeout period and nothing per tick, and a busy one costs nothing per frame.
///
/// Entries are opaque 64-bit keys (the event loop packs slot and generation into them, so
/// an entry that outlives its connection is recognised as stale and dropped).
/// Pure and single-threaded: owned by one event loop.
struct TimingWheel {
    private var slots: [[UInt64]]
    /// The last whole second that has been processed.
    private(set) var processedSecond: UInt32

    /// - Parameter slotCount: how many seconds one turn of the wheel covers. Deadlines
    ///   further ahead wrap around and are simply re-entered when their slot comes up early.
    init(slotCount: Int = 4096, startSecond: UInt32) {
        slots = Array(repeating: [], count: slotCount)
        processedSecond = startSecond
    }

    /// Enters `key` to come due at `second` (or at the next tick if that is already past).
    mutating func schedule(_ key: UInt64, at second: UInt32) {
        let due = max(second, processedSecond &+ 1)
        slots[Int(due % UInt32(slots.count))].append(key)
    }

    /// Removes and returns the keys of every slot from the last processed second up to
    /// `second`. The caller decides, per key, whether it really expired or must be
    /// scheduled again (which then lands after `second`).
    mutating func advance(to second: UInt32) -> [UInt64] {
        guard second > processedSecond else { return [] }
        // After a long stall only one turn needs visiting: every slot is covered once.
        let steps = min(UInt64(second - processedSecond), UInt64(slots.count))
        var current = second &- UInt32(steps)
        var due: [UInt64] = []
        for _ in 0..<steps {
            current &+= 1
            let index = Int(current % UInt32(slots.count))
            guard !slots[index].isEmpty else { continue }
            due += slots[index]
            slots[index] = []
        }
        processedSecond = second
        return due
    }

    /// Number of entries, stale ones included (for statistics and tests).
    var count: Int { slots.reduce(0) { $0 + $1.count } }
}
