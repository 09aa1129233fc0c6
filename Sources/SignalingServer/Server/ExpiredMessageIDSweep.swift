import SignalingStore

/// The message ids that expired while the server was down, to be forgotten in the store
/// after start-up, a chunk at a time: the store writer commits each chunk as a unit of its
/// own whenever nothing the loops journaled is waiting (`StoreWriter.run`).
///
/// Why: the start-up load skips an expired id (`SwitchboardState.load`), and the server
/// forgets an id at its expiry only while it runs (`dedupExpiry`). Without the sweep, every
/// restart that spanned a dedup window left up to `--dedup-capacity` records in the store
/// for good.
///
/// Invariant: the forget of a key (sender, message id) is committed before any later
/// remember of that key. A sender may use an id again once it has expired, and a store that
/// forgets by key alone (Redis) would otherwise delete the new record. So `claim` takes the
/// forgets of the keys an arriving unit remembers, for the writer to commit just before
/// that unit, and later chunks skip them.
///
/// Cost: the expired records (the snapshot's, copied once) and eight bytes each for the
/// time order; while the sweep lasts, a binary search per id a unit remembers, nothing
/// once it is done. Chunks go in server-time order, which is the SQLite table's key order
/// (schema version 3): a chunk's deletes touch neighbouring pages, not one page each.
struct ExpiredMessageIDSweep {
    /// Ids forgotten per commit: small enough that a message arriving meanwhile waits for
    /// one chunk's commit at most (a few ms), large enough that a million ids take a few
    /// hundred commits.
    static let chunkSize = 4_096

    /// The expired records in key order (`StoredMessageKey`'s), for `claim`'s search.
    private let records: [StoredMessageID]
    /// Indices into `records` in server-time order: the order chunks take them.
    private let timeOrder: [Int32]
    /// Each record's position in `timeOrder`.
    private let turn: [Int32]
    /// How much of `timeOrder` chunks have taken.
    private var taken = 0
    /// Records taken out of turn by `claim`.
    private var claimed = Set<Int32>()
    /// Forgets handed out so far, by chunks and claims.
    private(set) var forgotten = 0

    /// `expired` in key order, as every store's snapshot lists its message ids
    /// (`StoredSnapshot.sort()`), one record per key.
    init(_ expired: [StoredMessageID]) {
        assert(zip(expired, expired.dropFirst()).allSatisfy { $0.key < $1.key }, "expired message ids out of key order")
        records = expired
        let timeOrder = expired.indices.map { Int32($0) }.sorted { expired[Int($0)].serverTime < expired[Int($1)].serverTime }
        var turn = [Int32](repeating: 0, count: expired.count)
        for (position, index) in timeOrder.enumerated() { turn[Int(index)] = Int32(position) }
        self.timeOrder = timeOrder
        self.turn = turn
    }

    /// Nothing left to hand out.
    var isDone: Bool { taken == timeOrder.count }

    /// The next chunk's forgets (at most `chunkSize`), oldest first; empty once done.
    mutating func nextChunk() -> [StoreChange] {
        var changes: [StoreChange] = []
        while taken < timeOrder.count && changes.count < Self.chunkSize {
            let index = timeOrder[taken]
            taken += 1
            if claimed.remove(index) != nil { continue }
            changes.append(Self.forget(records[Int(index)]))
        }
        if isDone { claimed = [] }
        forgotten += changes.count
        return changes
    }

    /// The forgets that must be committed before `unit`: those of the expired keys it
    /// remembers again that no chunk has taken yet.
    mutating func claim(_ unit: CommitUnit) -> [StoreChange] {
        guard !isDone else { return [] }
        var changes: [StoreChange] = []
        for change in unit.changes {
            guard case .rememberMessageID(let remembered) = change, let index = index(of: remembered.key),
                !isTaken(index), claimed.insert(index).inserted
            else { continue }
            changes.append(Self.forget(records[Int(index)]))
        }
        forgotten += changes.count
        return changes
    }

    private static func forget(_ record: StoredMessageID) -> StoreChange {
        .forgetMessageID(sender: record.sender, messageID: record.messageID, serverTime: record.serverTime)
    }

    /// The record of `key`, by binary search in key order.
    private func index(of key: StoredMessageKey) -> Int32? {
        var low = 0
        var high = records.count
        while low < high {
            let middle = (low + high) / 2
            if records[middle].key < key { low = middle + 1 } else { high = middle }
        }
        return low < records.count && records[low].key == key ? Int32(low) : nil
    }

    /// Whether a chunk has taken record `index` already.
    private func isTaken(_ index: Int32) -> Bool { Int(turn[Int(index)]) < taken }
}
