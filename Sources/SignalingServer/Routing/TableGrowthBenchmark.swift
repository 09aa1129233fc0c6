import SignalingSupport

/// What one insert costs while a routing table grows, the slowest above all: a Swift
/// `Dictionary` rehashes every key in the insert that outgrows its storage, an
/// `IncrementalHashTable` moves 32 slots per change (docs/LOAD-TESTING.md, "Tables that
/// grow a few slots at a time"). What `Tools/routing-bench growth` prints. Public for that
/// executable only; the server never calls it.
public enum TableGrowthBenchmark {
    public struct Figures: Sendable {
        public let table: String
        public let inserts: Int
        /// The slowest single insert, ns.
        public let longest: UInt64
        /// Inserts that took longer than 100 µs.
        public let over100Microseconds: Int
        /// Mean per insert, ns.
        public let mean: Double
    }

    /// Times `count` inserts of distinct message-id-like keys (36 characters, as a UUID)
    /// into each table: a `[String: UInt64]` (the routing core's tables until 4 December
    /// 2026), an `IncrementalDictionary<String, UInt64>`, one sender's ids through
    /// `SwitchboardState.rememberMessageID` (its table, the dedup expiry queue and the
    /// capacity check: what a MESSAGE_SEND's hold adds for its id), `count` users'
    /// activity records through `SwitchboardState.activity` (a user's first message), and
    /// the dedup expiry's `FIFOQueue` filled to `count`, then one push and one pop per id,
    /// and an expiry `DeadlineHeap` filled to `count` entries and emptied.
    public static func run(count: Int) -> [Figures] {
        precondition(count > 0)
        var random = FastRandom(seed: (11, 13, 17, 19))
        let keys = (0..<count).map { _ in uuidLike(&random) }
        var figures: [Figures] = []

        var dictionary: [String: UInt64] = [:]
        figures.append(timed("Dictionary<String, UInt64>", keys) { key, index in dictionary[key] = index })
        dictionary = [:]

        var incremental = IncrementalDictionary<String, UInt64>()
        figures.append(timed("IncrementalDictionary<String, UInt64>", keys) { key, index in incremental[key] = index })
        incremental = IncrementalDictionary()

        var configuration = SwitchboardConfiguration()
        configuration.dedupCapacity = count
        let now = Instant(nanoseconds: 1_000_000_000)
        var state = SwitchboardState(configuration: configuration, epoch: now)
        let sender = state.activity("sender")
        figures.append(timed("SwitchboardState.rememberMessageID", keys) { key, index in
            state.rememberMessageID(key, sender: "sender", serverTime: index, now: now, in: sender)
        })
        figures.append(timed("SwitchboardState.activity (new users)", keys) { key, _ in _ = state.activity(key) })

        // The dedup window's queue (`FIFOQueue`): pushed to `count` entries, then a push
        // and a pop per id, as at `--dedup-capacity`, where each id remembered forgets the oldest.
        var queue = FIFOQueue<(sender: String, messageID: String, deadline: Instant)>()
        figures.append(timed("FIFOQueue push (dedup expiry entries)", keys) { key, _ in queue.push(("sender", key, now)) })
        figures.append(timed("FIFOQueue push + pop, full", keys) { key, _ in
            queue.push(("sender", key, now))
            _ = queue.pop()
        })
        queue = FIFOQueue()

        // The session and device expiry heaps (`DeadlineHeap`, one entry per disconnected
        // device, deadlines mostly increasing as disconnects come in): filled to `count`,
        // then emptied, as when a day's expiries come due.
        var heap = DeadlineHeap<UInt32, UInt64, Void>()
        figures.append(timed("DeadlineHeap insert (expiry entries)", keys) { _, index in
            heap.insert(.init(deadline: UInt32(index / 16), key: index, stamp: ()))
        })
        figures.append(timed("DeadlineHeap pop (expiries due)", keys) { _, _ in _ = heap.popFirst() })
        return figures
    }

    private static func timed(_ table: String, _ keys: [String], _ insert: (String, UInt64) -> Void) -> Figures {
        var longest: UInt64 = 0
        var slow = 0
        let started = LoopMetrics.now()
        for (index, key) in keys.enumerated() {
            let before = LoopMetrics.now()
            insert(key, UInt64(index))
            let took = LoopMetrics.now() &- before
            longest = max(longest, took)
            if took > 100_000 { slow += 1 }
        }
        let total = LoopMetrics.now() &- started
        return Figures(table: table, inserts: keys.count, longest: longest, over100Microseconds: slow, mean: Double(total) / Double(keys.count))
    }

    /// 8-4-4-4-12 lowercase hexadecimal digits.
    private static func uuidLike(_ random: inout FastRandom) -> String {
        let digits = Array("0123456789abcdef".utf8)
        var bytes: [UInt8] = []
        bytes.reserveCapacity(36)
        for position in 0..<36 {
            if position == 8 || position == 13 || position == 18 || position == 23 {
                bytes.append(UInt8(ascii: "-"))
            } else {
                bytes.append(digits[Int(random.next() & 15)])
            }
        }
        return String(decoding: bytes, as: UTF8.self)
    }
}
