/// A binary min-heap of (deadline, key, stamp), for deadlines whose owners re-arm them
/// lazily. Entries are never removed from the middle: an owner that reschedules either
/// bumps its record's stamp, so that an entry whose stamp no longer matches is skipped
/// when it comes out (the push scheduler), or keeps its one entry and, when it comes out,
/// looks at its real deadline and enters it again (the switchboard's expiries; `Stamp`
/// is then `Void`, which takes no room). Either way an owner has a bounded number of
/// entries however often its deadline moves.
///
/// Costs: O(log n) per insert and per removal; the storage (`ChunkedArray`) grows and
/// shrinks a chunk of 4,096 entries at a time, so no insert or removal copies the heap
/// (a flat array copied every entry in the insert that outgrew it, and again in the removal
/// that gave a burst's memory back), and the memory of a burst of entries is given back.
public struct DeadlineHeap<Deadline: Comparable, Key, Stamp> {
    public struct Entry {
        public var deadline: Deadline
        public var key: Key
        public var stamp: Stamp

        @inlinable
        public init(deadline: Deadline, key: Key, stamp: Stamp) {
            self.deadline = deadline
            self.key = key
            self.stamp = stamp
        }
    }

    @usableFromInline var storage = ChunkedArray<Entry>()

    /// Every entry, in heap order.
    @inlinable public var entries: [Entry] { storage.elements }

    public init() {}

    @inlinable public var count: Int { storage.count }
    @inlinable public var first: Entry? { storage.first }

    @inlinable
    public mutating func insert(_ entry: Entry) {
        storage.append(entry)
        var child = storage.count - 1
        while child > 0 {
            let parent = (child - 1) / 2
            guard storage[child].deadline < storage[parent].deadline else { break }
            storage.swapAt(child, parent)
            child = parent
        }
    }

    @inlinable
    @discardableResult
    public mutating func popFirst() -> Entry? {
        guard !storage.isEmpty else { return nil }
        storage.swapAt(0, storage.count - 1)
        let first = storage.removeLast()
        var parent = 0
        while true {
            let left = 2 * parent + 1
            let right = left + 1
            var smallest = parent
            if left < storage.count && storage[left].deadline < storage[smallest].deadline { smallest = left }
            if right < storage.count && storage[right].deadline < storage[smallest].deadline { smallest = right }
            guard smallest != parent else { break }
            storage.swapAt(parent, smallest)
            parent = smallest
        }
        return first
    }

    /// Rebuilds from scratch (drops stale entries in bulk).
    public mutating func replaceAll(with newEntries: [Entry]) {
        storage.removeAll()
        for entry in newEntries { insert(entry) }
    }

    public mutating func removeAll() { storage.removeAll() }
}
