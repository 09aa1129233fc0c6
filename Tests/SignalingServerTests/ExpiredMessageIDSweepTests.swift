import SignalingProtocol
import SignalingStore
@testable import SignalingServer
import SignalingSupport
import TestSupport
import Testing

/// Message ids that expired while the server was down: the load skips them, and the store
/// writer forgets them in the store after start-up, a chunk at a time, each before any
/// new record of the same id.
@Suite("Expired message ids swept after a restart")
struct ExpiredMessageIDSweepTests {
    static func record(_ sender: String, _ id: String, at serverTime: UInt64) -> StoredMessageID {
        StoredMessageID(sender: sender, messageID: id, serverTime: serverTime, expiresAt: serverTime + 1)
    }

    static func forgotten(_ changes: [StoreChange]) -> [String] {
        changes.compactMap { if case .forgetMessageID(let sender, let id, _) = $0 { "\(sender)/\(id)" } else { nil } }
    }

    /// `count` ids of one sender ("s/00000", ...), in key order, the later ids the older.
    static func expired(_ count: Int) -> [StoredMessageID] {
        (0..<count).map { record("s", String(format: "%05d", $0), at: UInt64(1_000_000 - $0)) }
    }

    @Test("chunks forget every expired id once, oldest first, at most a chunk at a time")
    func chunksInServerTimeOrder() {
        let count = ExpiredMessageIDSweep.chunkSize + 10
        var sweep = ExpiredMessageIDSweep(Self.expired(count))
        let first = sweep.nextChunk()
        #expect(first.count == ExpiredMessageIDSweep.chunkSize)
        #expect(Self.forgotten(first).first == String(format: "s/%05d", count - 1), "the oldest first")
        #expect(!sweep.isDone)
        let second = sweep.nextChunk()
        #expect(second.count == 10)
        #expect(sweep.isDone && sweep.nextChunk().isEmpty)
        #expect(Set(Self.forgotten(first + second)).count == count && sweep.forgotten == count)
        if case .forgetMessageID(_, _, let serverTime)? = second.last { #expect(serverTime == 1_000_000) }
    }

    @Test("an expired id remembered again is forgotten before the unit that remembers it, and by no later chunk; ids already swept or never expired are not claimed")
    func claimedBeforeTheNewRecord() {
        let count = ExpiredMessageIDSweep.chunkSize + 10
        var sweep = ExpiredMessageIDSweep(Self.expired(count))
        let swept = sweep.nextChunk()  // the oldest chunkSize ids, "s/<count-1>" down to "s/00010"
        var unit = CommitUnit()
        for id in ["00003", String(format: "%05d", count - 1), "never-expired", "00003"] {
            unit.add(.rememberMessageID(StoredMessageID(sender: "s", messageID: id, serverTime: 2_000_000, expiresAt: 3_000_000)))
        }
        let claimed = sweep.claim(unit)
        #expect(Self.forgotten(claimed) == ["s/00003"], "only the expired id no chunk has taken, once")
        if case .forgetMessageID(_, _, let serverTime)? = claimed.first { #expect(serverTime == 1_000_000 - 3, "the old record's") }
        let rest = Self.forgotten(sweep.nextChunk())
        #expect(rest.count == 9 && !rest.contains("s/00003"))
        #expect(!Self.forgotten(swept).contains("s/00003"))
        #expect(sweep.isDone && sweep.forgotten == count)
    }

    @Test("after a restart, the ids that expired while the server was down are forgotten in the store; ids still within the window stay and still de-duplicate")
    func restartForgetsExpiredIDs() throws {
        let store = ModelEventStore()
        let clock = ManualClock()
        let window: (inout ServerConfiguration) -> Void = { $0.dedupWindow = .seconds(60) }
        do {
            let server = try TestServer(store: store, clock: clock, window)
            let (alice, _) = try server.connect(user: "alice")
            _ = try server.connect(user: "bob")
            #expect(try alice.request(1, Request.identifiedMessage("m1", to: "bob")).isOK)
            try server.advance(by: .seconds(30))
            #expect(try alice.request(2, Request.identifiedMessage("m2", to: "bob")).isOK)
        }
        let stored = try store.loadSnapshot().messageIDs
        let m1 = try #require(stored.first { $0.messageID == "m1" })
        let m2 = try #require(stored.first { $0.messageID == "m2" })
        // Down until m1 has expired, m2 not yet (the shutdown moved the clock a little).
        clock.advance(by: .milliseconds(Int64(m1.expiresAt - clock.wallMilliseconds()) + 1_000))
        #expect(clock.wallMilliseconds() < m2.expiresAt)

        let server = try TestServer(store: store, clock: clock, window)
        try server.waitFor("m1's record to be forgotten") { _ in
            (try? store.loadSnapshot().messageIDs.contains { $0.messageID == "m1" }) == false
        }
        #expect(try store.loadSnapshot().messageIDs.map(\.messageID) == ["m2"])
        let (alice, _) = try server.connect(user: "alice")
        guard case .ok(_, let serverTime) = try alice.request(3, Request.identifiedMessage("m2", to: "bob")) else {
            Issue.record("m2 again was not accepted")
            return
        }
        #expect(serverTime == m2.serverTime, "a duplicate: the first acceptance's time")
        #expect(try alice.request(4, Request.identifiedMessage("m1", to: "bob")).isOK)
        try server.waitFor("m1's new record") { _ in
            (try? store.loadSnapshot().messageIDs.contains { $0.messageID == "m1" && $0.serverTime > m1.serverTime }) == true
        }
    }

    @Test("an expired id remembered again while the sweep runs: its old record is forgotten before the new one is remembered, even by a store that forgets by id alone")
    func rememberedAgainDuringTheSweep() throws {
        var configuration = ServerConfiguration()
        configuration.workers = 1
        let context = ServerContext(
            configuration: configuration, clock: ManualClock(), logger: .silent, journaling: true,
            pushGateway: nil, tokenVerifier: nil)
        let store = ModelEventStore()
        // A chunk's worth of long-expired ids, then alice's m1, the newest: the sweep's second chunk.
        var expired = (0..<ExpiredMessageIDSweep.chunkSize).map { Self.record("zed", "x\($0)", at: 1_000 + UInt64($0)) }
        let m1 = Self.record("alice", "m1", at: 100_000)
        expired.append(m1)
        StoredSnapshot.sortMessageIDs(&expired)  // the snapshot's order
        try store.apply(expired.map { .rememberMessageID($0) })
        let writer = try StoreWriter(store: store, context: context, expiredMessageIDs: expired)

        store.closeGate()
        writer.start()
        defer {
            store.openGate()
            writer.stop()
        }
        #expect(eventually { store.appliesWaitingAtGate == 1 }, "the first chunk's commit did not start")
        #expect(Self.forgotten(store.lastAttempt).count == ExpiredMessageIDSweep.chunkSize)
        #expect(!Self.forgotten(store.lastAttempt).contains("alice/m1"))
        // While that commit hangs, alice's m1 is accepted again (a new record).
        var unit = CommitUnit()
        unit.add(.rememberMessageID(StoredMessageID(sender: "alice", messageID: "m1", serverTime: 200_000, expiresAt: 300_000)))
        if writer.enqueue(unit) { writer.wake() }
        store.openGate()
        func isForget(_ change: StoreChange) -> Bool { if case .forgetMessageID("alice", "m1", _) = change { true } else { false } }
        func isNewRecord(_ change: StoreChange) -> Bool { if case .rememberMessageID(let id) = change { id.serverTime == 200_000 } else { false } }
        #expect(eventually { store.appliedChanges.contains(where: isForget) && store.appliedChanges.contains(where: isNewRecord) })

        let applied = store.appliedChanges
        let forgets = applied.indices.filter { isForget(applied[$0]) }
        let remember = applied.firstIndex(where: isNewRecord)
        #expect(forgets.count == 1, "m1's old record forgotten once")
        if let forget = forgets.first, let remember { #expect(forget < remember, "the old record forgotten first") }
        if case .forgetMessageID(_, _, let serverTime)? = forgets.first.map({ applied[$0] }) { #expect(serverTime == m1.serverTime) }
        #expect(try store.loadSnapshot().messageIDs.map(\.serverTime) == [200_000])
    }
}
