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
}
