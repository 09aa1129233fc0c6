import SignalingProtocol

/// The first device of every user, by user id: a hash table that stores only the record
/// pointer (the key is the record's own `userID`).
///
/// A `[String: DeviceRecord]` costs 24 bytes per slot (the key's 16 plus the value's 8),
/// so 32 to 64 bytes per user at its load factors; this table costs 8 bytes per slot, 11 to
/// 21 per user. With one user per idle connection that difference is a tenth of the
/// per-connection budget. Open addressing with linear probing; deletion shifts entries
/// back instead of leaving tombstones, so the table never degrades.
///
/// Growth is incremental, like Redis's rehash, because the index lives under the
/// `Switchboard` lock that every loop takes: when the table passes 3/4 full, a table twice
/// as large becomes the current one (every insert goes there) and the old one is drained
/// `migrationStep` slots per insert or removal, while lookups consult both. A key is in
/// exactly one of the two tables. Moved and removed entries of the old table leave a
/// tombstone (`vacated`), which is harmless there since nothing is inserted into it again.
/// The drain ends well before the next growth could be due (after N/32 changes for a table
/// of N slots, when the new table of 2N is at most 3/8 + 1/64 full).
///
/// Cost: a lookup probes one table, two while growing; an insert or removal adds at most
/// `migrationStep` (32) visited slots and as many re-inserted entries, about a microsecond
/// (a re-insert hashes the user id). What is not bounded: allocating the new table, a zero
/// fill of 8 bytes per slot (16 MB at a million users, a millisecond or two), once per
/// doubling.
///
/// Guarded by the `Switchboard` lock, like the records it holds.
struct UserIndex {
    /// The current table: every insert goes here.
    private var slots: [DeviceRecord?]
    /// While growing, the previous table, drained from `drainCursor` on; empty otherwise.
    private var draining: [DeviceRecord?] = []
    private var drainCursor = 0
    private(set) var count = 0

    /// Slots of the old table visited per insert or removal while growing.
    static let migrationStep = 32

    /// Left in the old table where an entry was moved or removed, so that probes for the
    /// keys after it go on (compared by identity; never returned).
    private static let vacated = DeviceRecord(userID: "", deviceID: "", sessionID: SessionID(high: 0, low: 0))

    init(capacity: Int = 16) {
        var size = 16
        while size < capacity * 4 / 3 { size <<= 1 }
        slots = Array(repeating: nil, count: size)
    }

    /// Whether an old table is still being drained (for tests).
    var isGrowing: Bool { !draining.isEmpty }

    /// The slot holding `userID` in the current table, or the empty slot where it would go.
    private func find(_ userID: String) -> (index: Int, found: Bool) {
        let mask = slots.count - 1
        var index = userID.hashValue & mask
        while let occupant = slots[index] {
            if occupant.userID == userID { return (index, true) }
            index = (index + 1) & mask
        }
        return (index, false)
    }

    /// The slot holding `userID` in the old table, if it is still there.
    private func findDraining(_ userID: String) -> Int? {
        guard !draining.isEmpty else { return nil }
        let mask = draining.count - 1
        var index = userID.hashValue & mask
        while let occupant = draining[index] {
            if occupant !== Self.vacated && occupant.userID == userID { return index }
            index = (index + 1) & mask
        }
        return nil
    }

    subscript(userID: String) -> DeviceRecord? {
        get {
            let (index, found) = find(userID)
            if found { return slots[index] }
            return findDraining(userID).flatMap { draining[$0] }
        }
        set {
            migrateStep()
            if let record = newValue {
                precondition(record.userID == userID, "a user's head record must belong to that user")
                let (index, found) = find(userID)
                if !found, let old = findDraining(userID) {
                    draining[old] = Self.vacated  // moves to the current table: not a new key
                } else if !found {
                    count += 1
                }
                slots[index] = record
                if count * 4 > slots.count * 3 { grow() }
            } else {
                let (index, found) = find(userID)
                if found {
                    remove(at: index)
                } else if let old = findDraining(userID) {
                    draining[old] = Self.vacated
                    count -= 1
                }
            }
        }
    }

    private mutating func remove(at removed: Int) {
        let mask = slots.count - 1
        slots[removed] = nil
        count -= 1
        // Shift back every entry of the probe run that would no longer be reachable.
        var hole = removed
        var index = (removed + 1) & mask
        while let occupant = slots[index] {
            let ideal = occupant.userID.hashValue & mask
            // The entry may move into the hole unless its home lies cyclically in (hole, index].
            let distanceToIndex = (index - ideal) & mask
            let distanceToHole = (hole - ideal) & mask
            if distanceToHole < distanceToIndex {
                slots[hole] = occupant
                slots[index] = nil
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
        slots = Array(repeating: nil, count: draining.count * 2)
    }

    /// Moves the entries of the next `migrationStep` slots of the old table to the current
    /// one; drops the old table once it has all been visited.
    private mutating func migrateStep() {
        guard isGrowing else { return }
        let end = min(drainCursor + Self.migrationStep, draining.count)
        for index in drainCursor..<end {
            guard let record = draining[index], record !== Self.vacated else { continue }
            let (target, _) = find(record.userID)
            slots[target] = record
            draining[index] = Self.vacated
        }
        drainCursor = end
        if drainCursor == draining.count { draining = [] }
    }

    /// Every head record (for tests and statistics).
    var heads: [DeviceRecord] {
        slots.compactMap { $0 } + draining.compactMap { $0 === Self.vacated ? nil : $0 }
    }
}
