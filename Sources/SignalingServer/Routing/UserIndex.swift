/// The first device of every user, by user id: a hash table that stores only the record
/// pointer (the key is the record's own `userID`).
///
/// A `[String: DeviceRecord]` costs 24 bytes per slot (the key's 16 plus the value's 8),
/// so 32 to 64 bytes per user at its load factors; this table costs 8 bytes per slot, 11 to
/// 21 per user. With one user per idle connection that difference is a tenth of the
/// per-connection budget. Open addressing with linear probing; deletion shifts entries
/// back instead of leaving tombstones, so the table never degrades.
///
/// Guarded by the `Switchboard` lock, like the records it holds.
struct UserIndex {
    private var slots: [DeviceRecord?]
    private(set) var count = 0

    init(capacity: Int = 16) {
        var size = 16
        while size < capacity * 4 / 3 { size <<= 1 }
        slots = Array(repeating: nil, count: size)
    }

    private var mask: Int { slots.count - 1 }

    private func home(_ userID: String) -> Int { userID.hashValue & mask }

    /// The slot holding `userID`, or the empty slot where it would go.
    private func find(_ userID: String) -> (index: Int, found: Bool) {
        var index = home(userID)
        while let occupant = slots[index] {
            if occupant.userID == userID { return (index, true) }
            index = (index + 1) & mask
        }
        return (index, false)
    }

    subscript(userID: String) -> DeviceRecord? {
        get {
            let (index, found) = find(userID)
            return found ? slots[index] : nil
        }
        set {
            if let record = newValue {
                precondition(record.userID == userID, "a user's head record must belong to that user")
                let (index, found) = find(userID)
                slots[index] = record
                if !found {
                    count += 1
                    if count * 4 > slots.count * 3 { grow() }
                }
            } else {
                let (index, found) = find(userID)
                if found { remove(at: index) }
            }
        }
    }

    private mutating func remove(at removed: Int) {
        slots[removed] = nil
        count -= 1
        // Shift back every entry of the probe run that would no longer be reachable.
        var hole = removed
        var index = (removed + 1) & mask
        while let occupant = slots[index] {
            let ideal = home(occupant.userID)
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

    private mutating func grow() {
        let old = slots
        slots = Array(repeating: nil, count: old.count * 2)
        for case let record? in old {
            let (index, _) = find(record.userID)
            slots[index] = record
        }
    }

    /// Every head record (for tests and statistics).
    var heads: [DeviceRecord] { slots.compactMap { $0 } }
}
