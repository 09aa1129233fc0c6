import SignalingSupport

/// Which routing shard holds a user (docs/ARCHITECTURE.md, "Routing shards").
///
/// Everything the server keeps about a user (its devices and their queues, the messages
/// held for it, the ids of the messages it sent, its sender limits, its push
/// registrations, and the calls it is called in) lives in exactly one shard, picked by a
/// stable hash of the user id. Stable: the same id maps to the same shard in every
/// process and on every run (FNV-1a over the UTF-8 bytes, not Swift's per-process seeded
/// `Hasher`), so that a shard could be another process or node and tests can pick ids
/// that land on different shards.
///
/// Cost: one pass over the id's bytes per lookup, no allocation.
struct ShardMap: Sendable, Equatable {
    /// How many shards there are (at least 1).
    let count: Int
    /// The shard a `SwitchboardState` is (0 for the only one).
    let index: Int

    /// One shard owning every user: what a lone `SwitchboardState` (tests, one loop) is.
    static let single = ShardMap(count: 1, index: 0)

    init(count: Int, index: Int) {
        // At most `UInt16`'s range: a receipt carries its sender's shard in 16 bits
        // (`DeliveryReceipt.senderShard`; `--workers` is at most 256).
        precondition(count >= 1 && count <= 1 << 16 && (0..<count).contains(index), "shard \(index) of \(count)")
        self.count = count
        self.index = index
    }

    /// The shard of `userID` among `count` shards.
    static func shard(of userID: String, count: Int) -> Int {
        guard count > 1 else { return 0 }
        return Int(StableHash.fnv1a(userID) % UInt64(count))
    }

    /// Whether this shard holds `userID`.
    func owns(_ userID: String) -> Bool {
        count == 1 || Self.shard(of: userID, count: count) == index
    }
}
