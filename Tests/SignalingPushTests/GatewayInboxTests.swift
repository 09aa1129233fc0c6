import SignalingStore
import SignalingSupport
import Synchronization
import TestSupport
import Testing
@testable import SignalingPush

/// The lock-free submission inbox (`GatewayInbox`) and the per-device folding that the
/// gateway's thread does on each batch it takes (`WakeUpCoalescer`).
@Suite("Gateway inbox")
struct GatewayInboxTests {
    @Test("a batch is folded per device in the order of each device's first wake-up: higher kind, latest counter")
    func coalescer() {
        var coalescer = WakeUpCoalescer()
        var batch = [
            wakeUp(device: "a", kind: .call, pending: 1), wakeUp(device: "b", pending: 1),
            wakeUp(device: "a", kind: .message, pending: 2), wakeUp(device: "c", pending: 7),
            wakeUp(device: "b", kind: .missedCall, pending: 5),
        ]
        let folded = coalescer.coalesce(&batch)
        #expect(folded == 2)
        #expect(batch.map(\.deviceID) == ["a", "b", "c"])
        #expect(batch.map(\.kind) == [.call, .missedCall, .message])
        #expect(batch.map(\.pendingEvents) == [2, 5, 7])
        var single = [wakeUp(device: "a")]
        let none = coalescer.coalesce(&single)
        #expect(none == 0 && single.count == 1)
        var again = [wakeUp(device: "a", pending: 1), wakeUp(device: "a", pending: 3)]
        let foldedAgain = coalescer.coalesce(&again)
        #expect(foldedAgain == 1, "nothing kept from the earlier batch")
        #expect(again.map(\.pendingEvents) == [3])
    }

    @Test("submitters fold nothing: the gateway's thread folds the batch it takes per device and counts coalesced then")
    func foldedOnTheGatewayThread() throws {
        let harness = try GatewayHarness(start: false)
        for pending in 1...3 { #expect(harness.gateway.submit(wakeUp(device: "phone", pending: pending))) }
        #expect(harness.statistics.coalesced == 0, "nothing is folded by the submitters")
        #expect(harness.gateway.inbox.waitingCount == 3)
        try harness.gateway.start()
        try harness.waitFor("sent") { $0.sent == 1 }
        #expect(harness.statistics.coalesced == 2)
        #expect(harness.gateway.inbox.waitingCount == 0)
        #expect(try harness.bodies().map { $0["pending"] as? Int } == [3])
    }

    @Test("threads submitting while the consumer takes batches: none lost, each thread's order kept, folded per device")
    func concurrentSubmissions() throws {
        let inbox = try GatewayInbox(capacity: 1_000_000)
        let threads = 4, perThread = 5_000, devices = 16
        let done = Atomic<Int>(0)
        var taken: [WakeUp] = []
        // The consumer takes batches while the producers push (this thread is the consumer).
        let producers = JoinableThread {
            onThreads(threads) { thread in
                for index in 0..<perThread {
                    // The counter says who pushed it and when: thread * perThread + index.
                    _ = inbox.add(wakeUp(user: "t\(thread)", device: "d\(index % devices)", pending: thread * perThread + index))
                }
                done.add(1, ordering: .releasing)
            }
        }
        while done.load(ordering: .acquiring) < threads { inbox.takeAll(appendingTo: &taken) }
        producers.join()
        inbox.takeAll(appendingTo: &taken)
        #expect(taken.count == threads * perThread, "none lost")
        #expect(Set(taken.map(\.pendingEvents)).count == threads * perThread, "none twice")
        for thread in 0..<threads {
            let mine = taken.filter { $0.userID == "t\(thread)" }.map(\.pendingEvents)
            #expect(mine == mine.sorted(), "thread \(thread)'s wake-ups in its order")
        }
        #expect(inbox.waitingCount == 0)
        var coalescer = WakeUpCoalescer()
        let foldedTaken = coalescer.coalesce(&taken)
        #expect(foldedTaken == threads * perThread - threads * devices)
        #expect(taken.count == threads * devices)
        for wakeUp in taken {
            // The latest counter of each device: its thread's last submission for it.
            let thread = Int(wakeUp.userID.dropFirst())!, device = Int(wakeUp.deviceID.dropFirst())!
            let last = (perThread - 1) - ((perThread - 1 - device) % devices)
            #expect(wakeUp.pendingEvents == thread * perThread + last)
        }
    }

    @Test("threads racing for the last places: exactly capacity are queued, the rest refused as full, places free once taken")
    func fullUnderContention() throws {
        let capacity = 1_000
        let inbox = try GatewayInbox(capacity: capacity)
        let queued = Atomic<Int>(0), full = Atomic<Int>(0), closed = Atomic<Int>(0)
        onThreads(4) { thread in
            for index in 0..<500 {
                switch inbox.add(wakeUp(user: "t\(thread)", device: "d\(index)")) {
                case .queued: queued.add(1, ordering: .relaxed)
                case .full: full.add(1, ordering: .relaxed)
                case .closed: closed.add(1, ordering: .relaxed)
                }
            }
        }
        #expect(queued.load(ordering: .relaxed) == capacity)
        #expect(full.load(ordering: .relaxed) == 4 * 500 - capacity)
        #expect(closed.load(ordering: .relaxed) == 0)
        #expect(inbox.waitingCount == capacity)
        var taken: [WakeUp] = []
        inbox.takeAll(appendingTo: &taken)
        #expect(taken.count == capacity)
        #expect(inbox.add(wakeUp(device: "after")) == .queued)
    }

    @Test("closing while threads submit: each submission is queued and taken, or dropped by the close, or refused as closed")
    func closedUnderContention() throws {
        let inbox = try GatewayInbox(capacity: 1_000_000)
        let queued = Atomic<Int>(0), closed = Atomic<Int>(0), full = Atomic<Int>(0)
        let started = Atomic<Int>(0)
        let producers = JoinableThread {
            onThreads(3) { thread in
                started.add(1, ordering: .releasing)
                for index in 0..<5_000 {
                    switch inbox.add(wakeUp(user: "t\(thread)", device: "d\(index)")) {
                    case .queued: queued.add(1, ordering: .relaxed)
                    case .closed: closed.add(1, ordering: .relaxed)
                    case .full: full.add(1, ordering: .relaxed)
                    }
                }
            }
        }
        var taken: [WakeUp] = []
        while started.load(ordering: .acquiring) < 3 || taken.count < 100 { inbox.takeAll(appendingTo: &taken) }
        let dropped = inbox.close()
        producers.join()
        #expect(taken.count + dropped == queued.load(ordering: .relaxed), "every queued one taken or dropped, once")
        #expect(queued.load(ordering: .relaxed) + closed.load(ordering: .relaxed) == 3 * 5_000)
        #expect(full.load(ordering: .relaxed) == 0)
        #expect(inbox.add(wakeUp(device: "late")) == .closed)
        #expect(inbox.close() == 0, "closing twice drops nothing more")
        #expect(inbox.waitingCount == 0)
    }

    @Test("a gateway fed by several threads at once sends one wake-up per device with its latest counter")
    func gatewayFedConcurrently() throws {
        let harness = try GatewayHarness(start: false)
        let gateway = harness.gateway
        onThreads(4) { thread in
            for index in 0..<100 { gateway.submit(wakeUp(device: "d\(thread)", pending: index + 1)) }
        }
        try harness.gateway.start()
        try harness.waitFor("four sent") { $0.sent == 4 }
        let stats = harness.statistics
        #expect(stats.submitted == 400 && stats.coalesced == 396 && stats.droppedQueueFull == 0)
        let bodies = try harness.bodies()
        #expect(Set(bodies.compactMap { $0["device"] as? String }) == ["d0", "d1", "d2", "d3"])
        #expect(bodies.allSatisfy { $0["pending"] as? Int == 100 })
    }
}
