/// What `IncrementalHashTable` stores: a value that carries its own key (a device record
/// its user id, `KeyedValue` a key beside its value).
protocol HashTableEntry {
    associatedtype HashKey: Hashable
    var hashKey: HashKey { get }
}

/// A hash table whose growth is incremental, like Redis's rehash: no insert ever rehashes
/// the whole table. The routing core's tables grow while a loop holds their shard, and a
/// Swift `Dictionary` that outgrows its storage rehashes every key in that one insert: a
/// single sender's table of message ids (`UserActivity.recentMessageIDs`) stalled its loop
/// 7 ms at 24,576 ids and 200-250 ms at a million (`Tools/routing-bench growth`), and
/// every connection of the loop waited that long.
///
/// Open addressing with linear probing; deletion shifts entries back instead of leaving
/// tombstones, so the table never degrades. When the table passes 3/4 full, a table twice
/// as large becomes the current one (every insert goes there) and the old one is drained
/// `migrationStep` slots per insert or removal, while lookups consult both. A key is in
/// exactly one of the two tables. Moved and removed entries of the old table leave a
/// tombstone (`vacated`), harmless there since nothing is inserted into it again. The
/// drain ends well before the next growth could be due (after N/32 changes for a table of N
/// slots, when the new table of 2N is at most 3/8 + 1/64 full).
///
/// Cost: a lookup hashes its key once and probes one table, two while growing; an insert or
/// removal adds at most `migrationStep` (32) visited slots and as many re-inserted entries,
/// about a microsecond (a re-insert hashes its key). What is not bounded: allocating the
/// new table and filling its slots (`MemoryLayout<Slot>.stride` bytes each: 8 for a class
/// entry, 24 for a string key and a word), once per doubling: 9-44 ms for the 2 million
/// slots of a million message ids, up to 108 ms for a million users' activity records.
/// Memory: a slot per 3/8 to 3/4 of an entry, no storage at all until the first insert
/// (most users' tables stay empty or tiny).
///
/// Not thread-safe: owned like the shard state that holds it.
struct IncrementalHashTable<Entry: HashTableEntry> {
    typealias Key = Entry.HashKey

    /// A class entry's slot is one word: the two empty cases are spare bit patterns of the
    /// reference.
    enum Slot {
        case empty
        /// Left in the old table where an entry was moved or removed, so that probes for
        /// the keys after it go on.
        case vacated
        case occupied(Entry)
    }

    /// The current table: every insert goes here. Empty until the first insert.
    private var slots: [Slot] = []
    /// While growing, the previous table, drained from `drainCursor` on; empty otherwise.
    private var draining: [Slot] = []
    private var drainCursor = 0
    private(set) var count = 0
    /// The current table's size at the first insert (a power of two).
    private let firstSize: Int

    /// Slots of the old table visited per insert or removal while growing.
    static var migrationStep: Int { 32 }

    /// `capacity`: entries the first table holds before it grows (no storage is allocated
    /// before the first insert).
    init(capacity: Int = 3) {
        var size = 4
        while size * 3 < capacity * 4 { size <<= 1 }
        firstSize = size
    }

    /// Whether an old table is still being drained.
    var isGrowing: Bool { !draining.isEmpty }

    var isEmpty: Bool { count == 0 }

    /// Slots in the current table (0 before the first insert).
    var capacitySlots: Int { slots.count }

    subscript(key: Key) -> Entry? {
        guard count > 0 else { return nil }
        let hash = key.hashValue
        if let entry = findCurrent(key, hash: hash).entry { return entry }
        guard let old = findDraining(key, hash: hash), case .occupied(let entry) = draining[old] else { return nil }
        return entry
    }

    /// Inserts `entry`, or replaces the entry with its key; returns the replaced one.
    @discardableResult
    mutating func insert(_ entry: Entry) -> Entry? {
        migrateStep()
        if slots.isEmpty { slots = Array(repeating: .empty, count: firstSize) }
        let hash = entry.hashKey.hashValue
        var (index, replaced) = findCurrent(entry.hashKey, hash: hash)
        if replaced == nil {
            if let old = findDraining(entry.hashKey, hash: hash) {
                // Moves to the current table: not a new key.
                if case .occupied(let moved) = draining[old] { replaced = moved }
                draining[old] = .vacated
            } else {
                // A new key: room first, so that no table is ever more than 3/4 full (the
                // old table of a growth keeps empty slots, where probes for absent keys end;
                // a table of 4 slots filled before it grew had none).
                if (count + 1) * 4 > slots.count * 3 {
                    grow()
                    index = findCurrent(entry.hashKey, hash: hash).index
                }
                count += 1
            }
        }
        slots[index] = .occupied(entry)
        return replaced
    }

    /// Removes the entry with `key`; returns it (nil: there was none).
    @discardableResult
    mutating func remove(_ key: Key) -> Entry? {
        guard count > 0 else { return nil }
        migrateStep()
        let hash = key.hashValue
        let (index, current) = findCurrent(key, hash: hash)
        if let removed = current {
            removeCurrent(at: index)
            return removed
        }
        guard let old = findDraining(key, hash: hash), case .occupied(let removed) = draining[old] else { return nil }
        draining[old] = .vacated
        count -= 1
        return removed
    }

    /// Hands `body` every entry, in no particular order.
    func forEach(_ body: (Entry) throws -> Void) rethrows {
        for table in [slots, draining] {
            for case .occupied(let entry) in table { try body(entry) }
        }
    }

    /// Every entry, in no particular order.
    var entries: [Entry] {
        var all: [Entry] = []
        all.reserveCapacity(count)
        forEach { all.append($0) }
        return all
    }

    /// The slot holding `key` in the current table and its entry, or the empty slot where
    /// it would go and nil.
    private func findCurrent(_ key: Key, hash: Int) -> (index: Int, entry: Entry?) {
        let mask = slots.count - 1
        var index = hash & mask
        while case .occupied(let entry) = slots[index] {
            if entry.hashKey == key { return (index, entry) }
            index = (index + 1) & mask
        }
        return (index, nil)
    }

    /// The slot holding `key` in the old table, if it is still there.
    private func findDraining(_ key: Key, hash: Int) -> Int? {
        guard !draining.isEmpty else { return nil }
        let mask = draining.count - 1
        var index = hash & mask
        while true {
            switch draining[index] {
            case .empty: return nil
            case .occupied(let entry) where entry.hashKey == key: return index
            case .occupied, .vacated: index = (index + 1) & mask
            }
        }
    }

    private mutating func removeCurrent(at removed: Int) {
        let mask = slots.count - 1
        slots[removed] = .empty
        count -= 1
        // Shift back every entry of the probe run that would no longer be reachable.
        var hole = removed
        var index = (removed + 1) & mask
        while case .occupied(let occupant) = slots[index] {
            let ideal = occupant.hashKey.hashValue & mask
            // The entry may move into the hole unless its home lies cyclically in (hole, index].
            let distanceToIndex = (index - ideal) & mask
            let distanceToHole = (hole - ideal) & mask
            if distanceToHole < distanceToIndex {
                slots.swapAt(hole, index)
                hole = index
            }
            index = (index + 1) & mask
        }
    }

    /// Makes a table twice as large the current one and starts draining the old one.
    private mutating func grow() {
        // Never reached with a drain under way (see the type's comment); finishing it
        // first keeps the invariant of two tables at most if it ever were.
        while isGrowing { migrateStep() }
        draining = slots
        drainCursor = 0
        slots = Array(repeating: .empty, count: draining.count * 2)
    }

    /// Moves the entries of the next `migrationStep` slots of the old table to the current
    /// one; drops the old table once it has all been visited.
    private mutating func migrateStep() {
        guard isGrowing else { return }
        let end = min(drainCursor + Self.migrationStep, draining.count)
        for index in drainCursor..<end {
            guard case .occupied(let entry) = draining[index] else { continue }
            let (target, _) = findCurrent(entry.hashKey, hash: entry.hashKey.hashValue)
            slots[target] = .occupied(entry)
            draining[index] = .vacated
        }
        drainCursor = end
        if drainCursor == draining.count { draining = [] }
    }
}

/// A key and its value, as `IncrementalDictionary` stores them.
struct KeyedValue<Key: Hashable, Value>: HashTableEntry {
    let hashKey: Key
    var value: Value
}

/// The part of `Dictionary`'s interface the routing core uses, on an
/// `IncrementalHashTable`: for the tables that grow with traffic while their shard is held
/// (message ids per sender, users with activity, calls, push registrations per device,
/// per-sender counts), where a `Dictionary`'s growth rehashed every key in one insert.
struct IncrementalDictionary<Key: Hashable, Value>: Sequence {
    private var table = IncrementalHashTable<KeyedValue<Key, Value>>()

    init() {}

    subscript(key: Key) -> Value? {
        get { table[key]?.value }
        set {
            if let newValue {
                table.insert(KeyedValue(hashKey: key, value: newValue))
            } else {
                table.remove(key)
            }
        }
    }

    @discardableResult
    mutating func removeValue(forKey key: Key) -> Value? {
        table.remove(key)?.value
    }

    var count: Int { table.count }
    var isEmpty: Bool { table.isEmpty }
    /// Whether an old table is still being drained (for tests).
    var isGrowing: Bool { table.isGrowing }

    var keys: [Key] { table.entries.map(\.hashKey) }
    var values: [Value] { table.entries.map(\.value) }

    /// Every pair, in no particular order (a copy: the table may change while they are used).
    func makeIterator() -> IndexingIterator<[(key: Key, value: Value)]> {
        table.entries.map { (key: $0.hashKey, value: $0.value) }.makeIterator()
    }
}
