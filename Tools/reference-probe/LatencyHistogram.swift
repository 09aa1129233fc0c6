/// Nanosecond durations in log-linear buckets: exact below 128 ns, then 64 buckets per power
/// of two, so every value is known to within 1.6 %. Fixed size, and recording is a shift
/// and an increment, so measuring does not disturb what is measured.
struct LatencyHistogram: Sendable {
    private static let linearLimit = 128
    private static let bucketsPerPowerOfTwo = 64
    private static let bucketCount = linearLimit + (63 - 7 + 1) * bucketsPerPowerOfTwo

    private var counts = [UInt64](repeating: 0, count: bucketCount)
    private(set) var count: UInt64 = 0
    private(set) var minimum: UInt64 = .max
    private(set) var maximum: UInt64 = 0
    private(set) var sum: UInt64 = 0

    mutating func record(_ nanoseconds: UInt64) {
        counts[Self.bucket(of: nanoseconds)] &+= 1
        count &+= 1
        sum &+= nanoseconds
        minimum = min(minimum, nanoseconds)
        maximum = max(maximum, nanoseconds)
    }

    /// The least value v such that `percent` % of the samples are ≤ v: the upper edge of
    /// its bucket (never understating), clamped to the exact maximum. 0 when empty.
    func value(atPercent percent: Double) -> UInt64 {
        guard count > 0 else { return 0 }
        let rank = max(1, UInt64((percent / 100 * Double(count)).rounded(.up)))
        var seen: UInt64 = 0
        for index in counts.indices where counts[index] != 0 {
            seen += counts[index]
            if seen >= rank { return min(maximum, max(minimum, Self.upperEdge(of: index))) }
        }
        return maximum
    }

    var mean: Double { count == 0 ? 0 : Double(sum) / Double(count) }

    private static func bucket(of value: UInt64) -> Int {
        if value < UInt64(linearLimit) { return Int(value) }
        let exponent = 63 - value.leadingZeroBitCount  // 7...63
        let top = Int(value >> UInt64(exponent - 6))  // 64...127: the leading 7 bits
        return linearLimit + (exponent - 7) * bucketsPerPowerOfTwo + (top - bucketsPerPowerOfTwo)
    }

    private static func upperEdge(of index: Int) -> UInt64 {
        if index < linearLimit { return UInt64(index) }
        let offset = index - linearLimit
        let shift = UInt64(offset / bucketsPerPowerOfTwo + 1)  // exponent - 6
        let top = UInt64(offset % bucketsPerPowerOfTwo + bucketsPerPowerOfTwo)
        return (top << shift) &+ (1 << shift) &- 1  // wraps to .max for the last bucket
    }
}
