import Synchronization
import Testing
@testable import SignalingServer

@Suite("Lock-hold histogram and per-loop counters (pure)")
struct LoopCountersTests {
    @Test("a log2 histogram puts each hold in its power-of-two bucket and keeps the longest")
    func log2Histogram() {
        let histogram = LatencyHistogram.routingLockHold()
        #expect(histogram.bounds.first == 64 && histogram.bounds[1] == 128 && histogram.bounds.count == 19)
        for nanoseconds: UInt64 in [0, 1, 64, 65, 128, 129, 1_000, 16_777_216, 16_777_217, 5_000_000_000] {
            histogram.record(nanoseconds: nanoseconds)
        }
        let snapshot = histogram.snapshot()
        // Same buckets as the linear scan of the general histogram.
        let reference = LatencyHistogram(bounds: histogram.bounds)
        for nanoseconds: UInt64 in [0, 1, 64, 65, 128, 129, 1_000, 16_777_216, 16_777_217, 5_000_000_000] {
            reference.record(nanoseconds: nanoseconds)
        }
        #expect(snapshot.counts == reference.snapshot().counts)
        #expect(snapshot.counts[0] == 3 && snapshot.counts[1] == 2 && snapshot.counts[2] == 1 && snapshot.counts.last == 2)
        #expect(snapshot.count == 10)
        #expect(snapshot.maxNanoseconds == 5_000_000_000)
        #expect(snapshot.quantileNanoseconds(0.5) == 128)
        #expect(snapshot.quantileNanoseconds(1) == 5_000_000_000)
        #expect(LatencyHistogram.routingLockHold().snapshot().quantileNanoseconds(0.5) == nil)
    }

    @Test("a snapshot taken while its writer records has a count equal to its buckets' sum (a scrape's +Inf bucket equals _count)")
    func snapshotCountMatchesBuckets() async {
        let histogram = LatencyHistogram.routingLockHold()
        final class Flag: Sendable { let raised = Atomic<Bool>(false) }
        let done = Flag()
        let mismatches = await withTaskGroup(of: Int.self) { group in
            group.addTask {
                for step in 0..<2_000_000 { histogram.record(nanoseconds: UInt64(step & 1023)) }
                done.raised.store(true, ordering: .releasing)
                return 0
            }
            group.addTask {
                var mismatches = 0
                while !done.raised.load(ordering: .acquiring) {
                    let snapshot = histogram.snapshot()
                    if snapshot.count != snapshot.counts.reduce(0, &+) { mismatches += 1 }
                }
                return mismatches
            }
            return await group.reduce(0, +)
        }
        #expect(mismatches == 0)
        #expect(histogram.snapshot().count == 2_000_000)
    }

    @Test("threads that are not loops share one cell with atomic adds: nothing is lost; a high-water mark reads the largest")
    func stripedCounterOffLoop() async {
        let counter = StripedCounter(loops: 2)
        let mark = StripedCounter(loops: 2, .maximum)
        await withTaskGroup(of: Void.self) { group in
            for task in 0..<8 {
                group.addTask {
                    for step in 0..<10_000 {
                        counter.increment()
                        mark.raise(to: task * 10_000 + step)
                    }
                    counter.decrement(by: 5_000)
                }
            }
        }
        #expect(counter.value == 8 * 5_000)
        #expect(mark.value == 79_999)
    }

    @Test("a timed hold lands in its own lock's histogram only, and lasts at least as long as the work under the lock")
    func timedHolds() {
        let holds = LockHolds()
        holds.record(.callDirectory, nanoseconds: 100)
        holds.record(.callDirectory, nanoseconds: 3_000)
        #expect(holds.snapshot(.callDirectory).count == 2 && holds.snapshot(.callDirectory).maxNanoseconds == 3_000)
        #expect(SharedLock.allCases.filter { $0 != .callDirectory }.allSatisfy { holds.snapshot($0).count == 0 })
        #expect(holds.histogram(.routingShard).bounds == LatencyHistogram.routingLockHold().bounds)

        // Off a loop the hold goes to the process's off-loop histograms (which other tests
        // may add to as well: only growth is checked).
        let before = LockHolds.offLoop.snapshot(.logThrottle).count
        let mutex = Mutex(0)
        let result = mutex.withLock(timing: .logThrottle) { value -> Int in
            let start = LoopMetrics.now()
            while LoopMetrics.now() &- start < 50_000 {}
            value += 1
            return value
        }
        #expect(result == 1)
        let after = LockHolds.offLoop.snapshot(.logThrottle)
        #expect(after.count >= before + 1)
        #expect(after.maxNanoseconds >= 50_000, "the hold covers the work under the lock")
    }
}
