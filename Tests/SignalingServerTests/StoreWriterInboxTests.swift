import SignalingProtocol
@testable import SignalingServer
import SignalingStore
import SignalingSupport
import TestSupport
import Testing

/// The store writer's inbox is two lock-free queues (StoreWriter.swift, top): the loops
/// push commit units that the writer takes, and the deferred OKs that loop 0 takes into its
/// own deadline list. What must hold: each producer's units reach the store in the order
/// it pushed them, however many push at once and while the writer takes; and loop 0
/// refuses an overdue OK whatever the writer is doing, even blocked in a write, whichever
/// loop pushed it.
@Suite("The store writer's inbox without a lock")
struct StoreWriterInboxTests {
    @Test("units pushed by several threads at once while the writer commits reach the store in each producer's order, none lost")
    func unitsInProducerOrder() throws {
        let producers = 4, unitsEach = 2_000
        var configuration = ServerConfiguration()
        configuration.workers = 1
        configuration.commitInterval = .microseconds(100)  // many takes while the producers push
        let context = ServerContext(
            configuration: configuration, clock: ManualClock(), logger: .silent, journaling: true,
            pushGateway: nil, tokenVerifier: nil)
        let store = ModelEventStore()
        let writer = try StoreWriter(store: store, context: context)
        writer.start()

        // One device per producer; `lastSeen` numbers its units (an upsert is never
        // compacted away, so every unit leaves its change in the store's log). Halfway, each
        // producer waits until the writer has committed something: so the writer takes
        // between pushes of every producer however the threads are scheduled (the first
        // commit holds first halves only, and every second half needs a later one).
        let threads = (0..<producers).map { producer in
            JoinableThread {
                for number in 1...unitsEach {
                    if number == unitsEach / 2 + 1 { _ = eventually { writer.commits.load(ordering: .relaxed) > 0 } }
                    var unit = CommitUnit()
                    unit.changes = [.upsertDevice(
                        user: "producer-\(producer)", device: "d1", sessionID: SessionID(high: 1, low: 1),
                        lastSeen: UInt64(number))]
                    if writer.enqueue(unit) { writer.wake() }
                }
            }
        }
        for thread in threads { thread.join() }
        writer.stop()  // commits everything queued before it returns

        var seen = Array(repeating: [UInt64](), count: producers)
        for change in store.appliedChanges {
            guard case .upsertDevice(let user, _, _, let lastSeen) = change, let producer = Int(user.dropFirst("producer-".count))
            else { continue }
            seen[producer].append(lastSeen)
        }
        for (producer, numbers) in seen.enumerated() {
            #expect(numbers.count == unitsEach, "producer \(producer)'s units lost or repeated")
            let outOfOrder = numbers.indices.first { numbers[$0] != UInt64($0 + 1) }
            #expect(outOfOrder == nil, "producer \(producer)'s units out of order from its unit \(outOfOrder ?? 0) on")
        }
        #expect(writer.commits.load(ordering: .relaxed) > 1, "one commit only: the writer never took between the producers' pushes")
    }

    @Test("messages sent on both loops while the writer is blocked in a write: loop 0 refuses both at the store timeout, and the store serves again once the write returns")
    func overdueRefusedWhileWriterBlocked() throws {
        #expect(ShardMap.shard(of: "alice", count: 2) != ShardMap.shard(of: "bob", count: 2), "alice and bob must live on different loops")
        let store = ModelEventStore()
        let server = try TestServer(workers: 2, store: store) {
            $0.storeTimeout = .seconds(5)
            $0.delivery = .afterCommit  // nothing reaches a device before its commit: the replies are all there is to read
        }
        let (alice, _) = try server.connect(user: "alice")
        let (bob, _) = try server.connect(user: "bob")
        try server.waitFor("both devices to be stored") { _ in (try? store.loadSnapshot().devices.count) == 2 }
        // Their reserved numbers are committed with the warm-up's batch: nothing of theirs is
        // on its way to the store when the gate closes.
        #expect(try alice.request(900, Request.identifiedMessage("warm-up", to: "nobody")).isOK)
        #expect(try bob.request(900, Request.identifiedMessage("warm-up", to: "nobody")).isOK)

        store.closeGate()
        defer { store.openGate() }  // else a failure below would leave the server unable to stop
        // Each message's last step runs on the recipient's loop, which pushes its deferred OK:
        // one from each loop.
        try alice.send(.request(id: 1, Request.identifiedMessage("a1", to: "bob")))
        try bob.send(.request(id: 1, Request.identifiedMessage("b1", to: "alice")))
        try server.waitFor("the writer to block in a write") { _ in store.appliesWaitingAtGate == 1 }

        try server.advance(by: .milliseconds(4_900))
        #expect(try alice.staysSilent(for: .milliseconds(30)), "refused before the store timeout")
        try server.advance(by: .milliseconds(200))
        #expect(try alice.reply(to: 1).errorCode == .storeUnavailable)
        #expect(try bob.reply(to: 1).errorCode == .storeUnavailable)
        #expect(store.appliesWaitingAtGate == 1, "the write returned: this did not test a blocked writer")

        store.openGate()
        try server.waitFor("the gate to be passed") { _ in store.appliesWaitingAtGate == 0 }
        #expect(try alice.request(2, Request.identifiedMessage("a2", to: "bob")).isOK)
        #expect(try bob.request(2, Request.identifiedMessage("b2", to: "alice")).isOK)
    }
}
