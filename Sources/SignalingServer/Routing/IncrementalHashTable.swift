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
/// about a microsecond (a re-insert hashes its key). A table larger than a segment
/// (`SlotSegments`) is allocated a segment at a time, at the segment's first write, and a
/// drained one freed a segment at a time as the drain passes it, so that no change
/// allocates, fills or frees more than one (`MemoryLayout<Slot>.stride` × 4,096 bytes: 32 KB
/// for a class entry, 96 KB for a string key and a word). Allocated and filled in one go,
/// the new table took 9-44 ms for the 2 million slots of a million message ids, up to 108
/// ms for a million users' activity records, and freeing the old one in the change that
/// ended its drain 10-15 ms (`Tools/routing-bench growth`; now 0.3-3 ms at worst).
/// Memory: a slot per 3/8 to 3/4 of an entry (less while a new table's segments are
/// unwritten), and one shared empty segment once a table has grown past a segment; no
/// storage at all until the first insert (most users' tables stay empty or tiny).
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
    private var slots = SlotSegments<Slot>()
    /// While growing, the previous table, drained from `drainCursor` on; empty otherwise.
    private var draining = SlotSegments<Slot>()
    /// A segment of empty slots that every segment of a new table shares until its first
    /// write copies it (made at the first growth past one segment).
    private var emptySegment: [Slot] = []
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
    var isGrowing: Bool { draining.count > 0 }

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
        if slots.count == 0 { slots = table(of: firstSize) }
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
            try table.forEach { slot in
                if case .occupied(let entry) = slot { try body(entry) }
            }
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
    @inline(__always)
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
    ///
    /// The slots before `drainCursor` are drained (moved, or empty from the start), and their
    /// segments may be freed already, so a probe never reads them: a key still in the old
    /// table sits at or after the cursor, and no slot between its home and it was empty, so
    /// a probe whose home lies before the cursor starts at the cursor, and one that runs off
    /// the table's end goes on at the cursor, not at 0. The part after the cursor may hold
    /// no empty slot near the drain's end: a probe stops where it started.
    private func findDraining(_ key: Key, hash: Int) -> Int? {
        guard draining.count > 0 else { return nil }
        let start = max(hash & (draining.count - 1), drainCursor)
        var index = start
        while true {
            switch draining[index] {
            case .empty: return nil
            case .occupied(let entry) where entry.hashKey == key: return index
            case .occupied, .vacated:
                index += 1
                if index == draining.count { index = drainCursor }
                if index == start { return nil }
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
        slots = table(of: draining.count * 2)
    }

    /// A table of `size` empty slots: one segment of its own up to a segment's size, else
    /// segments that share `emptySegment` (made here the first time).
    private mutating func table(of size: Int) -> SlotSegments<Slot> {
        guard size > SlotSegments<Slot>.segmentSlots else { return SlotSegments(Array(repeating: .empty, count: size)) }
        if emptySegment.isEmpty { emptySegment = Array(repeating: .empty, count: SlotSegments<Slot>.segmentSlots) }
        return SlotSegments(count: size, sharing: emptySegment)
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
        if drainCursor == draining.count {
            draining = SlotSegments()
        } else {
            // A segment at a time as the drain passes it, not the whole table at its end:
            // destroying a million slots took 10-15 ms in the change that ended the drain.
            draining.free(before: drainCursor)
        }
    }
}

/// A hash table's slots in segments of `segmentSlots` (4,096), so that a table twice as
/// large costs, when it is made, an array of one reference per segment: every segment of it
/// is the table's one empty segment, shared, until the first write to it copies it
/// (copy-on-write), a segment at a time. A table of one segment or less is an array of its
/// own size, read as before but for a size check; a larger one is read through an index
/// into the segment list and one into the segment (two bounds checks where a flat array
/// had one). Together +1.8 % routing-core instructions per fan-out event (callgrind).
/// (`ChunkedArray`, in SignalingSupport, is the growable kind of the same idea, for heaps.)
struct SlotSegments<Element> {
    static var segmentShift: Int { 12 }
    static var segmentSlots: Int { 1 << segmentShift }

    /// A table of one segment or less: its slots (empty otherwise). Read as a flat array,
    /// as before segments: most tables never grow past one.
    private var flat: [Element]
    /// A larger table: its segments (empty otherwise); those before `freedSegments` are
    /// freed (`free(before:)`).
    private var segments: [[Element]]
    private var freedSegments = 0
    /// Slots in all (a power of two; 0: no storage).
    let count: Int

    init() {
        flat = []
        segments = []
        count = 0
    }

    /// A table of one segment: `slots` (at most `segmentSlots`).
    init(_ slots: [Element]) {
        precondition(slots.count <= Self.segmentSlots)
        flat = slots
        segments = []
        count = slots.count
    }

    /// A table of `count` slots (a multiple of `segmentSlots`), every segment `empty`'s
    /// storage until it is written.
    init(count: Int, sharing empty: [Element]) {
        precondition(count % Self.segmentSlots == 0 && empty.count == Self.segmentSlots)
        flat = []
        segments = Array(repeating: empty, count: count >> Self.segmentShift)
        self.count = count
    }

    subscript(index: Int) -> Element {
        @inline(__always) get {
            if count <= Self.segmentSlots { return flat[index] }
            return segments[index &>> Self.segmentShift][index & (Self.segmentSlots - 1)]
        }
        @inline(__always) set {
            if count <= Self.segmentSlots {
                flat[index] = newValue
            } else {
                segments[index &>> Self.segmentShift][index & (Self.segmentSlots - 1)] = newValue
            }
        }
    }

    mutating func swapAt(_ first: Int, _ second: Int) {
        if count <= Self.segmentSlots { return flat.swapAt(first, second) }
        let kept = self[first]
        self[first] = self[second]
        self[second] = kept
    }

    /// Frees the segments wholly before `index` (a table of one segment keeps it): they
    /// are never read again.
    mutating func free(before index: Int) {
        guard count > Self.segmentSlots else { return }
        let end = index &>> Self.segmentShift
        while freedSegments < end {
            segments[freedSegments] = []
            freedSegments += 1
        }
    }

    func forEach(_ body: (Element) throws -> Void) rethrows {
        for element in flat { try body(element) }
        for segment in segments {
            for element in segment { try body(element) }
        }
    }

    /// Segments with storage of their own: not `empty`'s (for tests; a table of one
    /// segment or less counts as one).
    func allocatedSegments(sharing empty: [Element]) -> Int {
        guard count > Self.segmentSlots else { return count > 0 ? 1 : 0 }
        let shared = empty.withUnsafeBufferPointer { $0.baseAddress }
        return segments.count { segment in segment.withUnsafeBufferPointer { $0.baseAddress } != shared }
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
