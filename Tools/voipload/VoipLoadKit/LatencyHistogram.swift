/// A log-linear histogram of nanosecond durations, in the spirit of HdrHistogram: exact
/// below 128 ns, and above that 64 buckets per power of two, so every recorded value is
/// known to within 1.6 % whatever its size. Fixed size (3,776 counters), mergeable across
/// workers, and cheap to record into (a shift and an increment), so the tool's own
/// measuring does not disturb what it measures.
public struct LatencyHistogram: Sendable, Equatable {
    static let linearLimit: UInt64 = 128
    static let subBucketsPerPowerOfTwo = 64
    static let bucketCount = Int(linearLimit) + (63 - 7 + 1) * subBucketsPerPowerOfTwo

    public private(set) var counts: [UInt64]
    public private(set) var totalCount: UInt64 = 0
    public private(set) var minimum: UInt64 = .max
    public private(set) var maximum: UInt64 = 0
    /// Sum of all values; wraps only after ~584 years of recorded latency.
    public private(set) var sum: UInt64 = 0

    public init() {
        counts = [UInt64](repeating: 0, count: Self.bucketCount)
    }

    public var isEmpty: Bool { totalCount == 0 }

    public mutating func record(nanoseconds value: UInt64) {
        counts[Self.bucketIndex(value)] &+= 1
        totalCount &+= 1
        sum &+= value
        if value < minimum { minimum = value }
        if value > maximum { maximum = value }
    }

    public mutating func merge(_ other: LatencyHistogram) {
        guard !other.isEmpty else { return }
        for index in other.counts.indices where other.counts[index] != 0 {
            counts[index] &+= other.counts[index]
        }
        totalCount &+= other.totalCount
        sum &+= other.sum
        minimum = Swift.min(minimum, other.minimum)
        maximum = Swift.max(maximum, other.maximum)
    }

    /// The smallest recorded-value bound v such that at least `percentile` % of the values
    /// are ≤ v. Reported as the upper edge of the bucket (never understating), clamped to
    /// the exact maximum. Zero for an empty histogram.
    public func value(atPercentile percentile: Double) -> UInt64 {
        guard totalCount > 0 else { return 0 }
        let clamped = Swift.min(100, Swift.max(0, percentile))
        let rank = Swift.max(1, UInt64((clamped / 100 * Double(totalCount)).rounded(.up)))
        var seen: UInt64 = 0
        for index in counts.indices where counts[index] != 0 {
            seen += counts[index]
            if seen >= rank {
                return Swift.min(maximum, Swift.max(minimum, Self.upperBound(ofBucket: index)))
            }
        }
        return maximum
    }

    public var mean: Double { totalCount == 0 ? 0 : Double(sum) / Double(totalCount) }

    static func bucketIndex(_ value: UInt64) -> Int {
        if value < linearLimit { return Int(value) }
        let exponent = 63 - value.leadingZeroBitCount  // ≥ 7
        let shift = exponent - 6
        let top = Int(value >> UInt64(shift))  // 64...127
        return Int(linearLimit) + (exponent - 7) * subBucketsPerPowerOfTwo + (top - subBucketsPerPowerOfTwo)
    }

    static func lowerBound(ofBucket index: Int) -> UInt64 {
        if index < Int(linearLimit) { return UInt64(index) }
        let offset = index - Int(linearLimit)
        let exponent = offset / subBucketsPerPowerOfTwo + 7
        let top = UInt64(offset % subBucketsPerPowerOfTwo + subBucketsPerPowerOfTwo)
        return top << UInt64(exponent - 6)
    }

    static func upperBound(ofBucket index: Int) -> UInt64 {
        if index < Int(linearLimit) { return UInt64(index) }
        if index == bucketCount - 1 { return .max }
        return lowerBound(ofBucket: index + 1) - 1
    }
}

/// The compact form a worker sends to the coordinator: only non-empty buckets.
public struct HistogramSnapshot: Codable, Sendable, Equatable {
    /// Pairs of bucket index and count, flattened: [i0, c0, i1, c1, ...].
    public var buckets: [UInt64]
    public var minimum: UInt64
    public var maximum: UInt64
    public var sum: UInt64

    public init(_ histogram: LatencyHistogram) {
        buckets = []
        for (index, count) in histogram.counts.enumerated() where count != 0 {
            buckets.append(UInt64(index))
            buckets.append(count)
        }
        minimum = histogram.minimum
        maximum = histogram.maximum
        sum = histogram.sum
    }
}

extension LatencyHistogram {
    /// Rebuilds a histogram from a snapshot; nil if the snapshot is not well formed.
    public init?(_ snapshot: HistogramSnapshot) {
        self.init()
        guard snapshot.buckets.count % 2 == 0 else { return nil }
        var total: UInt64 = 0
        for pair in stride(from: 0, to: snapshot.buckets.count, by: 2) {
            let index = snapshot.buckets[pair]
            guard index < UInt64(Self.bucketCount) else { return nil }
            counts[Int(index)] = snapshot.buckets[pair + 1]
            total &+= snapshot.buckets[pair + 1]
        }
        totalCount = total
        if total > 0 {
            minimum = snapshot.minimum
            maximum = snapshot.maximum
            sum = snapshot.sum
        }
    }
}
