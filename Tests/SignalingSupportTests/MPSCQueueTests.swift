import Synchronization
import Testing
@testable import SignalingSupport

@Suite("Lock-free MPSC queue")
struct MPSCQueueTests {
    struct Item: Sendable, Equatable {
        let producer: Int
        let index: Int
    }

    /// The queue in a class, so that threads can share it.
    final class Shared: Sendable {
        let queue = MPSCQueue<Item>()
    }

    /// What one producer thread pushed, in order, and which of its pushes were refused.
    final class Refusals: Sendable {
        let byProducer: Mutex<[[Int]]>
        init(producers: Int) { byProducer = Mutex(Array(repeating: [], count: producers)) }
    }

    @Test("elements come out in the order they went in, a batch contiguous, and the queue is empty after a take")
    func order() {
        let queue = MPSCQueue<Int>()
        queue.push(1)
        queue.push(contentsOf: [2, 3, 4])
        queue.push(5)
        var taken: [Int] = [0]
        let tookFirst = queue.takeAll(appendingTo: &taken)
        #expect(tookFirst)
        #expect(taken == [0, 1, 2, 3, 4, 5])
        let emptied = queue.isEmpty
        let tookAgain = queue.takeAll(appendingTo: &taken)
        #expect(emptied && !tookAgain)
        #expect(taken == [0, 1, 2, 3, 4, 5])
    }

    @Test("only the push into an empty queue is told to wake the consumer")
    func wakeOncePerBatch() {
        let queue = MPSCQueue<Int>()
        let pushes = [queue.push(1), queue.push(contentsOf: [2, 3]), queue.push(contentsOf: [Int]())]
        #expect(pushes == [.queuedFirst, .queued, .queued])
        var taken: [Int] = []
        queue.takeAll(appendingTo: &taken)
        let emptyBatch = queue.push(contentsOf: [Int]())
        #expect(emptyBatch == .queued, "an empty batch queues nothing and wakes no one")
        let nextBatch = queue.push(contentsOf: [4, 5])
        #expect(nextBatch == .queuedFirst)
    }

    @Test("a closed queue hands over what was queued, refuses every push and takes nothing more")
    func close() {
        let queue = MPSCQueue<Int>()
        queue.push(contentsOf: [1, 2])
        var taken: [Int] = []
        let tookOnClose = queue.close(appendingTo: &taken)
        #expect(tookOnClose)
        #expect(taken == [1, 2])
        let (closed, empty) = (queue.isClosed, queue.isEmpty)
        #expect(closed && empty)
        let pushes = [queue.push(3), queue.push(contentsOf: [4, 5])]
        #expect(pushes == [.refused, .refused])
        let tookAfterClose = queue.takeAll(appendingTo: &taken)
        #expect(!tookAfterClose)
        let tookOnSecondClose = queue.close(appendingTo: &taken)
        #expect(!tookOnSecondClose, "closing twice takes nothing")
        #expect(taken == [1, 2])
    }

    @Test("elements left in a queue that goes away are released")
    func releasesOnDeinit() {
        final class Tracked: Sendable {}
        weak var first: Tracked?
        weak var refused: Tracked?
        do {
            let queue = MPSCQueue<Tracked>()
            let tracked = Tracked()
            first = tracked
            queue.push(contentsOf: [tracked, Tracked()])
            var taken: [Tracked] = []
            queue.close(appendingTo: &taken)
            let other = Tracked()
            refused = other
            let pushed = queue.push(other)
            #expect(pushed == .refused)
        }
        #expect(first == nil && refused == nil)
        do {
            let queue = MPSCQueue<Tracked>()
            let tracked = Tracked()
            first = tracked
            queue.push(tracked)
        }
        #expect(first == nil, "a queue dropped while it still holds elements frees them")
    }

    @Test("items pushed by several threads at once each arrive exactly once, in each thread's order")
    func concurrentProducers() {
        let producers = 4, items = 20_000
        let shared = Shared()
        let threads = (0..<producers).map { producer in
            JoinableThread {
                var index = 0
                while index < items {
                    // Singles and batches mixed: both must keep the producer's order.
                    if index % 7 == 0 && index + 3 <= items {
                        shared.queue.push(contentsOf: (index..<index + 3).map { Item(producer: producer, index: $0) })
                        index += 3
                    } else {
                        shared.queue.push(Item(producer: producer, index: index))
                        index += 1
                    }
                }
            }
        }
        var taken: [Item] = []
        let deadline = ContinuousClock.now + .seconds(60)
        while taken.count < producers * items && ContinuousClock.now < deadline {
            shared.queue.takeAll(appendingTo: &taken)
        }
        for thread in threads { thread.join() }
        shared.queue.takeAll(appendingTo: &taken)
        #expect(taken.count == producers * items)
        var next = Array(repeating: 0, count: producers)
        for item in taken {
            guard item.index == next[item.producer] else {
                Issue.record("producer \(item.producer): item \(item.index) came where \(next[item.producer]) was due")
                return
            }
            next[item.producer] += 1
        }
        #expect(next == Array(repeating: items, count: producers))
    }

    @Test("items pushed while the consumer closes the queue are either taken or refused to their poster, never lost nor both")
    func closeRace() {
        let producers = 3, items = 30_000
        for round in 0..<4 {
            let shared = Shared()
            let refusals = Refusals(producers: producers)
            let started = Atomic<Int>(0)
            let threads = (0..<producers).map { producer in
                JoinableThread {
                    started.add(1, ordering: .relaxed)
                    var refused: [Int] = []
                    for index in 0..<items where shared.queue.push(Item(producer: producer, index: index)) == .refused {
                        refused.append(index)
                    }
                    refusals.byProducer.withLock { $0[producer] = refused }
                }
            }
            // Close at a different point each round, while the producers push.
            while started.load(ordering: .relaxed) < producers {}
            var taken: [Item] = []
            let closeAfter = (round + 1) * items / 4
            let deadline = ContinuousClock.now + .seconds(60)
            while taken.count < closeAfter && ContinuousClock.now < deadline {
                shared.queue.takeAll(appendingTo: &taken)
            }
            shared.queue.close(appendingTo: &taken)
            for thread in threads { thread.join() }
            let tookAfterClose = shared.queue.takeAll(appendingTo: &taken)
            #expect(!tookAfterClose)

            let refused = refusals.byProducer.withLock { $0 }
            for producer in 0..<producers {
                let arrived = taken.filter { $0.producer == producer }.map(\.index)
                let kept = refused[producer]
                // Taken: a prefix, in order; refused: the rest (a push refused once is
                // refused for good).
                #expect(arrived == Array(0..<arrived.count), "producer \(producer): taken out of order or with gaps")
                #expect(kept == Array(arrived.count..<items), "producer \(producer): an item was lost or both taken and refused")
            }
        }
    }
}
