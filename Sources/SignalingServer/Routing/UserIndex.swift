/// The first device of every user, by user id: a hash table that stores only the record
/// pointer (the key is the record's own `userID`).
///
/// A `[String: DeviceRecord]` costs 24 bytes per slot (the key's 16 plus the value's 8),
/// so 32 to 64 bytes per user at its load factors; this table costs 8 bytes per slot, 11 to
/// 21 per user. With one user per idle connection that difference is a tenth of the
/// per-connection budget.
///
/// Growth is incremental (`IncrementalHashTable`): the index grows while a loop holds its
/// shard, and no insert rehashes every user. The table's slot for a record is one word
/// (the empty and vacated marks are spare bit patterns of the reference).
///
/// Owned like the shard state that holds it, and so are the records.
struct UserIndex {
    private var table: IncrementalHashTable<DeviceRecord>

    /// Slots of the old table visited per insert or removal while growing.
    static var migrationStep: Int { IncrementalHashTable<DeviceRecord>.migrationStep }

    init(capacity: Int = 16) {
        table = IncrementalHashTable(capacity: capacity)
    }

    var count: Int { table.count }

    /// Whether an old table is still being drained (for tests).
    var isGrowing: Bool { table.isGrowing }

    subscript(userID: String) -> DeviceRecord? {
        get { table[userID] }
        set {
            if let record = newValue {
                precondition(record.userID == userID, "a user's head record must belong to that user")
                table.insert(record)
            } else {
                table.remove(userID)
            }
        }
    }

    /// Every head record (for tests and statistics).
    var heads: [DeviceRecord] { table.entries }
}

extension DeviceRecord: HashTableEntry {
    var hashKey: String { userID }
}
