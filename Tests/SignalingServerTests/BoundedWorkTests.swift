import SignalingProtocol
import SignalingSupport
import Synchronization
import Testing
@testable import SignalingServer

/// The routing lock is shared by every loop, so no hold may do unbounded work: expiry runs
/// a budget of deadlines per hold, and the user index grows a few slots per change.
@Suite("Bounded work under the routing lock (routing core, pure)")
struct BoundedExpiryTests {
    let epoch = Instant(nanoseconds: 1_000_000_000_000)

    func at(_ seconds: Double) -> Instant { epoch + .milliseconds(Int64((seconds * 1000).rounded())) }

    @Test("10,000 due deadlines run 256 per call, in deadline order, none skipped")
    func expiryBudget() throws {
        var effects: [SwitchboardEffect] = []
        var configuration = SwitchboardConfiguration()
        configuration.sessionTTL = .seconds(100)
        configuration.dedupWindow = .seconds(100)
        var state = SwitchboardState(configuration: configuration, epoch: epoch)
        // 5,000 session expiries, disconnects 10 ms apart (several share a second: the
        // order among those is free), and 5,000 message ids, remembered 10 ms apart.
        var devices: [(record: DeviceRecord, session: SessionID, second: UInt32)] = []
        for index in 0..<5_000 {
            let connection = ConnectionRef(loop: 0, slot: UInt32(index), generation: 1)
            let grant = try state.attach(userID: "u\(index)", deviceID: "d", resume: nil, connection: connection, now: at(1), into: &effects).get()
            let lost = at(10 + Double(index) * 0.01)
            state.detach(grant.record, connection: connection, now: lost)
            devices.append((grant.record, grant.sessionID, state.second(lost)))
        }
        let sender = state.activity("alice")
        for index in 0..<5_000 {
            state.rememberMessageID(
                "m\(index)", sender: "alice", serverTime: 0, now: at(10 + Double(index) * 0.01), in: sender)
        }

        var calls = 0
        var moreDue = true
        var expiredBefore = 0
        var forgottenBefore = 0
        while moreDue {
            moreDue = state.expire(now: at(1_000), into: &effects).moreDue
            calls += 1
            let expired = devices.filter { $0.record.sessionID != $0.session }
            let forgotten = (0..<5_000).filter { sender.recentMessageIDs["m\($0)"] == nil }
            // Each call but the last takes exactly its budget.
            let handled = expired.count - expiredBefore + forgotten.count - forgottenBefore
            #expect(handled == (moreDue ? SwitchboardState.expiryBudget : 10_000 - expiredBefore - forgottenBefore))
            // Sessions expire in the order of their disconnects (to the second)...
            let latestExpired = expired.map(\.second).max() ?? 0
            let earliestLeft = devices.filter { $0.record.sessionID == $0.session }.map(\.second).min() ?? .max
            #expect(latestExpired <= earliestLeft, "a session expired before an earlier one (call \(calls))")
            // ...and message ids in the order they were remembered.
            #expect(forgotten == Array(0..<forgotten.count), "an id was forgotten before an older one (call \(calls))")
            expiredBefore = expired.count
            forgottenBefore = forgotten.count
            try #require(calls <= 100, "expire never reports that it is done")
        }
        #expect(calls == (10_000 + SwitchboardState.expiryBudget - 1) / SwitchboardState.expiryBudget)
        #expect(state.counters.sessionsExpired == 5_000)
        #expect(sender.recentMessageIDs.isEmpty)
        #expect(state.expire(now: at(1_000), into: &effects).moreDue == false, "nothing is left")
    }

    @Test("a deadline that is not due stays, whatever the budget left")
    func budgetLeavesFutureDeadlines() throws {
        var effects: [SwitchboardEffect] = []
        var state = SwitchboardState(configuration: SwitchboardConfiguration(), epoch: epoch)
        let sender = state.activity("alice")
        for index in 0..<300 {
            state.rememberMessageID("m\(index)", sender: "alice", serverTime: 0, now: at(Double(index)), in: sender)
        }
        // The window is a day: at 86,400 + 149.5 s the first 150 ids are due.
        #expect(state.expire(now: at(86_400 + 149.5), into: &effects).moreDue == false)
        #expect(sender.recentMessageIDs.count == 150)
        #expect(sender.recentMessageIDs["m150"] != nil && sender.recentMessageIDs["m149"] == nil)
    }
}

@Suite("User index grows incrementally (pure)")
struct IncrementalUserIndexTests {
    private func record(_ user: String) -> DeviceRecord {
        DeviceRecord(userID: user, deviceID: "d", sessionID: SessionID(high: 0, low: 1))
    }

    @Test("during a migration, lookups, inserts, replacements and removals agree with a dictionary")
    func changesDuringMigration() {
        var index = UserIndex()
        var model: [String: DeviceRecord] = [:]
        var inserted = 0
        // Fill until a growth starts (the table of 1,024 slots passes 3/4).
        while !index.isGrowing || model.count < 700 {
            let user = "u\(inserted)"
            inserted += 1
            let value = record(user)
            index[user] = value
            model[user] = value
        }
        #expect(index.isGrowing)
        for (key, value) in model { #expect(index[key] === value, "\(key) not found in either table") }

        var generator = FastRandom(seed: (3, 5, 7, 9))
        var steps = 0
        while index.isGrowing && steps < 100_000 {
            steps += 1
            let user = generator.next() % 4 == 0 ? "new\(generator.next() % 100_000)" : "u\(generator.next() % UInt64(inserted))"
            switch generator.next() % 3 {
            case 0:
                let value = record(user)
                index[user] = value
                model[user] = value
            case 1:
                index[user] = nil
                model[user] = nil
            default:
                #expect(index[user] === model[user], "lookup of \(user) during the migration")
            }
            #expect(index.count == model.count)
        }
        #expect(!index.isGrowing)
        for (key, value) in model { #expect(index[key] === value, "lost \(key)") }
        #expect(Set(index.heads.map(\.userID)) == Set(model.keys))
        #expect(index.heads.count == model.count)
    }

    @Test("the old table is drained after at most N/32 inserts or removals")
    func migrationLength() {
        var index = UserIndex()
        var users = 0
        while !index.isGrowing {
            index["u\(users)"] = record("u\(users)")
            users += 1
        }
        // The growth happened at 3/4 of the old table: it had ⌈users·4/3⌉ rounded to a power of two slots.
        var oldSlots = 16
        while oldSlots * 3 < (users - 1) * 4 { oldSlots <<= 1 }
        var changes = 0
        while index.isGrowing {
            index["extra\(changes)"] = record("extra\(changes)")
            changes += 1
        }
        #expect(changes <= oldSlots / UserIndex.migrationStep)
        #expect(index.count == users + changes)
    }

    @Test("200,000 inserts through many growths keep every entry, and removing them all empties it")
    func growthKeepsEverything() {
        var index = UserIndex()
        var records: [DeviceRecord] = []
        for number in 0..<200_000 {
            let value = record("user-\(number)")
            records.append(value)
            index[value.userID] = value
        }
        #expect(index.count == 200_000)
        for value in records { #expect(index[value.userID] === value) }
        #expect(Set(index.heads.map(ObjectIdentifier.init)) == Set(records.map(ObjectIdentifier.init)))
        for value in records { index[value.userID] = nil }
        #expect(index.count == 0)
        #expect(index.heads.isEmpty)
        #expect(index["user-7"] == nil)
    }
}

/// The routing core's tables that grow with traffic (a sender's message ids, users with
/// activity, calls, push registrations, per-sender counts) grow like the user index: a
/// `Dictionary` rehashed every key in the one insert that outgrew it (7 ms at 24,576 ids,
/// docs/LOAD-TESTING.md, "Tables that grow a few slots at a time").
@Suite("Routing tables grow a few slots at a time (pure)")
struct IncrementalTableTests {
    let now = Instant(nanoseconds: 1_000_000_000)

    @Test("during a migration, lookups, inserts, replacements and removals agree with a dictionary")
    func dictionaryAgreesDuringMigration() {
        var table = IncrementalDictionary<String, Int>()
        var model: [String: Int] = [:]
        var generator = FastRandom(seed: (5, 7, 11, 13))
        var migrations = 0
        var wasGrowing = false
        for step in 0..<60_000 {
            let key = "k\(generator.next() % 6_000)"
            switch generator.next() % 5 {
            case 0, 1, 2:
                table[key] = step
                model[key] = step
            case 3:
                #expect(table.removeValue(forKey: key) == model.removeValue(forKey: key), "removal of \(key)")
            default:
                #expect(table[key] == model[key], "lookup of \(key)")
            }
            #expect(table.count == model.count)
            if table.isGrowing && !wasGrowing { migrations += 1 }
            wasGrowing = table.isGrowing
        }
        #expect(migrations >= 5, "the test must cross several growths")
        for (key, value) in model { #expect(table[key] == value, "lost \(key)") }
        #expect(Dictionary(uniqueKeysWithValues: table.map { ($0.key, $0.value) }) == model)
        #expect(Set(table.keys) == Set(model.keys))
        #expect(table.values.sorted() == model.values.sorted())
    }

    @Test("a class entry's slot is one word, and an empty table holds no storage")
    func slotSizes() {
        #expect(MemoryLayout<IncrementalHashTable<DeviceRecord>.Slot>.stride == 8)
        var table = IncrementalHashTable<KeyedValue<String, UInt64>>()
        #expect(table.capacitySlots == 0)
        #expect(table["m1"] == nil)
        #expect(table.remove("m1") == nil)
        #expect(table.capacitySlots == 0, "a lookup or removal allocates nothing")
        table.insert(KeyedValue(hashKey: "m1", value: 1))
        #expect(table.capacitySlots == 4)
    }

    @Test("an absent key is not found right after each growth, the first from 4 slots included")
    func absentKeyAfterGrowth() {
        var table = IncrementalHashTable<KeyedValue<String, UInt64>>()
        var growths = 0
        for number in 0..<5_000 {
            let wasGrowing = table.isGrowing
            table.insert(KeyedValue(hashKey: "k\(number)", value: UInt64(number)))
            if table.isGrowing && !wasGrowing {
                growths += 1
                // (A table filled before it grew had no empty slot to end this probe.)
                #expect(table["absent"] == nil)
            }
        }
        #expect(growths >= 10)
    }

    @Test("a table larger than a segment gets each segment's storage at its first write, and frees a drained table's a segment at a time")
    func segmentsAllocatedAndFreedOneAtATime() {
        let size = SlotSegments<Int>.segmentSlots
        let empty = Array(repeating: -1, count: size)
        var slots = SlotSegments(count: 8 * size, sharing: empty)
        #expect(slots.allocatedSegments(sharing: empty) == 0, "a new table is one shared segment")
        #expect(slots[5 * size + 7] == -1)
        slots[5 * size + 7] = 42
        slots[5 * size + 8] = 43
        #expect(slots.allocatedSegments(sharing: empty) == 1)
        #expect(slots[5 * size + 7] == 42 && slots[5 * size + 8] == 43 && slots[7] == -1)
        #expect(empty.allSatisfy { $0 == -1 }, "the shared segment is never written")
        slots[0] = 1
        slots.swapAt(0, 5 * size + 7)
        #expect(slots[0] == 42 && slots[5 * size + 7] == 1 && slots.allocatedSegments(sharing: empty) == 2)
        slots.free(before: 5 * size + 8)
        var seen: [Int] = []
        slots.forEach { if $0 != -1 { seen.append($0) } }
        #expect(seen == [1, 43], "the segments before the sixth are freed, the rest kept")
    }

    @Test("a probe of the old table skips its drained part and ends where it started when the rest has no empty slot")
    func probeOfDrainedTableEnds() throws {
        // 48 keys whose home slots in a table of 64 are its second half: they fill slots
        // 32-63 and wrap round into 0-15. The 49th insert grows the table; the next change
        // drains slots 0-31 of the old one, whose rest (32-63) then has no empty slot.
        let keys = (0...).lazy.map { "k\($0)" }.filter { $0.hashValue & 63 >= 32 }
        var table = IncrementalHashTable<KeyedValue<String, Int>>(capacity: 48)
        for (number, key) in keys.prefix(48).enumerated() { table.insert(KeyedValue(hashKey: key, value: number)) }
        #expect(table.capacitySlots == 64 && !table.isGrowing)
        table.insert(KeyedValue(hashKey: "grows", value: 48))
        #expect(table.capacitySlots == 128 && table.isGrowing)
        #expect(table.remove("not there") == nil)  // a change: slots 0-31 of the old table drained
        #expect(table.isGrowing)
        let absent = try #require(keys.first { key in !keys.prefix(48).contains(key) })
        #expect(table[absent] == nil, "a probe of the old table's full tail ends")
        for (number, key) in keys.prefix(48).enumerated() { #expect(table[key]?.value == number, "\(key) lost") }
        #expect(table["grows"]?.value == 48)
    }

    @Test("tens of thousands of keys across segmented growths: every key found, removed keys gone")
    func manyKeysAcrossSegmentedGrowths() {
        var table = IncrementalDictionary<String, Int>()
        for number in 0..<50_000 {
            table["k\(number)"] = number
            if number % 3 == 0 { table["k\(number / 2)"] = nil }
        }
        var expected: [String: Int] = [:]
        for number in 0..<50_000 {
            expected["k\(number)"] = number
            if number % 3 == 0 { expected["k\(number / 2)"] = nil }
        }
        #expect(table.count == expected.count)
        for (key, value) in expected { #expect(table[key] == value, "\(key)") }
        #expect(table["k\(0)"] == nil && table["absent"] == nil)
    }

    @Test("a sender's message ids grow with at most N/32 messages migrating a table of N slots")
    func senderMessageIDsGrowIncrementally() {
        var state = SwitchboardState(configuration: SwitchboardConfiguration(), epoch: now)
        let sender = state.activity("alice")
        var remembered = 0
        func remember() {
            state.rememberMessageID("m\(remembered)", sender: "alice", serverTime: UInt64(remembered), now: now, in: sender)
            remembered += 1
        }
        // Up to a growth from 8,192 slots (it starts at 3/4 of them, 6,144 ids).
        while remembered < 6_000 || !sender.recentMessageIDs.isGrowing { remember() }
        #expect(remembered == 6_145, "the growth came where a 3/4 load factor puts it")
        var during = 0
        while sender.recentMessageIDs.isGrowing {
            remember()
            during += 1
        }
        #expect(during <= 8_192 / IncrementalHashTable<KeyedValue<String, UInt64>>.migrationStep)
        #expect(sender.recentMessageIDs.count == remembered)
        #expect((0..<remembered).allSatisfy { sender.recentMessageIDs["m\($0)"] == UInt64($0) })
    }

    @Test("users' activity records grow incrementally, and are all found during the growth")
    func activitiesGrowIncrementally() {
        var state = SwitchboardState(configuration: SwitchboardConfiguration(), epoch: now)
        var users = 0
        while users < 3_000 || !state.activities.isGrowing {
            _ = state.activity("u\(users)")
            users += 1
        }
        let records = (0..<users).map { state.activities["u\($0)"] }
        #expect(records.allSatisfy { $0 != nil })
        while state.activities.isGrowing {
            _ = state.activity("u\(users)")
            users += 1
        }
        #expect(state.activities.count == users)
        #expect((0..<records.count).allSatisfy { state.activities["u\($0)"] === records[$0] }, "a record was replaced")
    }
}
