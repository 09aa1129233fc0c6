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
        var configuration = SwitchboardConfiguration()
        configuration.sessionTTL = .seconds(100)
        configuration.dedupWindow = .seconds(100)
        var state = SwitchboardState(configuration: configuration, epoch: epoch)
        // 5,000 session expiries, disconnects 10 ms apart (several share a second: the
        // order among those is free), and 5,000 message ids, remembered 10 ms apart.
        var devices: [(record: DeviceRecord, session: SessionID, second: UInt32)] = []
        for index in 0..<5_000 {
            let connection = ConnectionRef(loop: 0, slot: UInt32(index), generation: 1)
            let grant = try state.attach(userID: "u\(index)", deviceID: "d", resume: nil, connection: connection, now: at(1)).get()
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
            moreDue = state.expire(now: at(1_000)).moreDue
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
        #expect(state.expire(now: at(1_000)).moreDue == false, "nothing is left")
    }

    @Test("a deadline that is not due stays, whatever the budget left")
    func budgetLeavesFutureDeadlines() throws {
        var state = SwitchboardState(configuration: SwitchboardConfiguration(), epoch: epoch)
        let sender = state.activity("alice")
        for index in 0..<300 {
            state.rememberMessageID("m\(index)", sender: "alice", serverTime: 0, now: at(Double(index)), in: sender)
        }
        // The window is a day: at 86,400 + 149.5 s the first 150 ids are due.
        #expect(state.expire(now: at(86_400 + 149.5)).moreDue == false)
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
