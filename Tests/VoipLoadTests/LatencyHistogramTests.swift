import Testing
@testable import VoipLoadKit

@Suite struct LatencyHistogramTests {
    @Test func smallValuesAreExact() {
        var histogram = LatencyHistogram()
        for value in 1...100 { histogram.record(nanoseconds: UInt64(value)) }
        #expect(histogram.totalCount == 100)
        #expect(histogram.value(atPercentile: 50) == 50)
        #expect(histogram.value(atPercentile: 99) == 99)
        #expect(histogram.value(atPercentile: 100) == 100)
        #expect(histogram.minimum == 1 && histogram.maximum == 100)
        #expect(histogram.mean == 50.5)
    }

    @Test func largeValuesStayWithinTheRelativeError() {
        var histogram = LatencyHistogram()
        let values: [UInt64] = [150, 1_234, 20_000, 99_999, 1_000_000, 123_456_789, 60_000_000_000]
        for value in values {
            var single = LatencyHistogram()
            single.record(nanoseconds: value)
            histogram.record(nanoseconds: value)
            let index = LatencyHistogram.bucketIndex(value)
            #expect(LatencyHistogram.lowerBound(ofBucket: index) <= value)
            #expect(LatencyHistogram.upperBound(ofBucket: index) >= value)
            let width = Double(LatencyHistogram.upperBound(ofBucket: index) - LatencyHistogram.lowerBound(ofBucket: index))
            #expect(width / Double(value) < 0.016)
            #expect(single.value(atPercentile: 50) == value, "a single value is clamped to the exact min/max")
        }
        #expect(histogram.value(atPercentile: 100) == 60_000_000_000)
    }

    @Test func bucketsAreContiguousAndOrdered() {
        for index in 1..<LatencyHistogram.bucketCount {
            #expect(LatencyHistogram.lowerBound(ofBucket: index) == LatencyHistogram.upperBound(ofBucket: index - 1) + 1)
        }
        #expect(LatencyHistogram.bucketIndex(.max) == LatencyHistogram.bucketCount - 1)
    }

    @Test func percentilesOfAUniformSpread() {
        var histogram = LatencyHistogram()
        for micros in 1...10_000 { histogram.record(nanoseconds: UInt64(micros) * 1000) }
        for (percentile, expected) in [(50.0, 5_000_000.0), (90, 9_000_000), (99, 9_900_000), (99.9, 9_990_000)] {
            let value = Double(histogram.value(atPercentile: percentile))
            #expect(value >= expected && value <= expected * 1.016, "p\(percentile) = \(value)")
        }
    }

    @Test func mergingEqualsRecordingEverythingInOne() {
        var a = LatencyHistogram(), b = LatencyHistogram(), all = LatencyHistogram()
        for value in stride(from: UInt64(10), to: 5_000_000, by: 7_919) {
            if value % 2 == 0 { a.record(nanoseconds: value) } else { b.record(nanoseconds: value) }
            all.record(nanoseconds: value)
        }
        a.merge(b)
        #expect(a == all)
    }

    @Test func snapshotRoundTripsAndRejectsGarbage() throws {
        var histogram = LatencyHistogram()
        for value in [3, 300, 30_000, 3_000_000] as [UInt64] { histogram.record(nanoseconds: value) }
        let snapshot = HistogramSnapshot(histogram)
        #expect(snapshot.buckets.count == 8)
        #expect(LatencyHistogram(snapshot) == histogram)
        let empty = try #require(LatencyHistogram(HistogramSnapshot(LatencyHistogram())))
        #expect(empty.isEmpty && empty.value(atPercentile: 99) == 0)
        var broken = snapshot
        broken.buckets = [UInt64(LatencyHistogram.bucketCount), 1]
        #expect(LatencyHistogram(broken) == nil)
        broken.buckets = [1]
        #expect(LatencyHistogram(broken) == nil)
    }
}
