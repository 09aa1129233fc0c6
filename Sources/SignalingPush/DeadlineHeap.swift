import SignalingSupport

/// A binary min-heap of (deadline, key, stamp). Entries are never removed from the
/// middle: the owner bumps its record's stamp when it reschedules, and an entry whose
/// stamp no longer matches is skipped when it comes out (lazy deletion).
struct DeadlineHeap<Key> {
    struct Entry {
        var deadline: Instant
        var key: Key
        var stamp: UInt64
    }

    private(set) var entries: [Entry] = []

    var count: Int { entries.count }
    var first: Entry? { entries.first }

    mutating func insert(_ entry: Entry) {
        entries.append(entry)
        var child = entries.count - 1
        while child > 0 {
            let parent = (child - 1) / 2
            guard entries[child].deadline < entries[parent].deadline else { break }
            entries.swapAt(child, parent)
            child = parent
        }
    }

    @discardableResult
    mutating func popFirst() -> Entry? {
        guard !entries.isEmpty else { return nil }
        entries.swapAt(0, entries.count - 1)
        let first = entries.removeLast()
        var parent = 0
        while true {
            let left = 2 * parent + 1
            let right = left + 1
            var smallest = parent
            if left < entries.count && entries[left].deadline < entries[smallest].deadline { smallest = left }
            if right < entries.count && entries[right].deadline < entries[smallest].deadline { smallest = right }
            guard smallest != parent else { break }
            entries.swapAt(parent, smallest)
            parent = smallest
        }
        return first
    }

    /// Rebuilds from scratch (drops stale entries in bulk).
    mutating func replaceAll(with newEntries: [Entry]) {
        entries = []
        entries.reserveCapacity(newEntries.count)
        for entry in newEntries { insert(entry) }
    }

    mutating func removeAll() { entries.removeAll() }
}
