import CLinuxShims
import SignalingProtocol
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// A latency histogram with fixed bucket bounds (seconds, Prometheus `le`), updated by one
/// writer at a time and read by anyone. It also keeps the largest observation.
///
/// Cost: an update finds its bucket with a short linear scan over at most 18 bounds (or,
/// for the power-of-two bounds of `log2(from:buckets:)`, with one count-leading-zeros), then
/// four relaxed load/store pairs, no read-modify-write and no lock. That is only correct
/// because writers never overlap: each histogram belongs to one event loop (whose state, and
/// therefore this, is touched only in its callbacks: by its own thread while it runs, else
/// under its `ownership` lock), to one loop's own thread (`LoopMetrics.lockHolds`, the routing
/// lock's among them), or to a single writer thread (the store writer's commits), or is
/// written only under a lock (`Switchboard`'s holds from threads that are not loops,
/// `LockHolds.offLoop`). Readers may see a bucket updated
/// a moment before `sum`: a scrape is a snapshot, not a transaction. The count is not a
/// cell of its own but the sum of the buckets read, so a scrape's `+Inf` bucket always
/// equals its `_count` (read separately, a count updated after its bucket was read made
/// them differ by one: a Prometheus client rejects that).
final class LatencyHistogram: Sendable {
    /// Upper bounds in nanoseconds, ascending; an implicit +Inf bucket follows.
    let bounds: [UInt64]
    /// For `log2` bounds: log2 of the first bound (the bucket of n > first is
    /// ⌈log2 n⌉ - this); nil for arbitrary bounds (linear scan).
    private let log2FirstBound: Int?
    private let buckets: [MetricCell]
    private let sumNanoseconds = MetricCell()
    private let largest = MetricCell()

    /// 5 µs to 10 s: server-side push latency lives in the first third (most pushes take
    /// under 25 µs on an idle loop), store commits in the rest.
    static let defaultBounds: [UInt64] = [
        5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 2_500_000, 5_000_000, 10_000_000, 25_000_000,
        50_000_000, 100_000_000, 250_000_000, 1_000_000_000, 5_000_000_000, 10_000_000_000,
    ]

    init(bounds: [UInt64] = LatencyHistogram.defaultBounds) {
        self.bounds = bounds
        self.log2FirstBound = nil
        self.buckets = (0...bounds.count).map { _ in MetricCell() }
    }

    /// Bounds `first`, `2 × first`, ... (`buckets` of them, `first` a power of two): the
    /// bucket of an observation is found without a scan.
    init(log2From first: UInt64, buckets count: Int) {
        precondition(first > 0 && first & (first - 1) == 0 && count > 0, "log2 bounds start at a power of two")
        self.bounds = (0..<count).map { first << UInt64($0) }
        self.log2FirstBound = first.trailingZeroBitCount
        self.buckets = (0...count).map { _ in MetricCell() }
    }

    /// Records one observation (single writer at a time; see the type's comment).
    @inline(__always)
    func record(nanoseconds: UInt64) {
        var index = 0
        if let log2FirstBound {
            // ⌈log2 n⌉ for n ≥ 1 is the bit width of n - 1.
            let ceilingLog2 = UInt64.bitWidth - (nanoseconds &- 1).leadingZeroBitCount
            if nanoseconds > bounds[0] { index = min(ceilingLog2 - log2FirstBound, bounds.count) }
        } else {
            while index < bounds.count && nanoseconds > bounds[index] { index += 1 }
        }
        buckets[index].add(1)
        sumNanoseconds.add(nanoseconds)
        if nanoseconds > largest.value { largest.set(nanoseconds) }
    }

    /// Per-bucket counts (not cumulative; the last one is +Inf), the sum in nanoseconds,
    /// the count and the largest observation.
    func snapshot() -> HistogramSnapshot {
        let counts = buckets.map(\.value)
        return HistogramSnapshot(
            bounds: bounds, counts: counts, sumNanoseconds: sumNanoseconds.value, count: counts.reduce(0, &+),
            maxNanoseconds: largest.value)
    }
}

/// A histogram read at one moment; several (one per loop) add up.
struct HistogramSnapshot: Sendable {
    var bounds: [UInt64]
    var counts: [UInt64]
    var sumNanoseconds: UInt64
    var count: UInt64
    /// The largest observation (0 when there was none).
    var maxNanoseconds: UInt64 = 0

    static func + (a: HistogramSnapshot, b: HistogramSnapshot) -> HistogramSnapshot {
        HistogramSnapshot(
            bounds: a.bounds, counts: zip(a.counts, b.counts).map { $0 &+ $1 },
            sumNanoseconds: a.sumNanoseconds &+ b.sumNanoseconds, count: a.count &+ b.count,
            maxNanoseconds: max(a.maxNanoseconds, b.maxNanoseconds))
    }

    /// The upper bound of the bucket that holds the `quantile` (0...1) of the observations,
    /// capped at the largest one (nil without observations). Resolution: one bucket.
    func quantileNanoseconds(_ quantile: Double) -> UInt64? {
        guard count > 0 else { return nil }
        let rank = max(1, UInt64((Double(count) * quantile).rounded(.up)))
        var cumulative: UInt64 = 0
        for (index, bucketCount) in counts.enumerated() {
            cumulative &+= bucketCount
            if cumulative >= rank { return index < bounds.count ? min(bounds[index], maxNanoseconds) : maxNanoseconds }
        }
        return maxNanoseconds
    }
}

/// Counters and histograms of one event loop, for `/metrics`. Same single-writer rule as
/// `LatencyHistogram`: updated only in the loop's callbacks (`EventLoop.owned`), summed
/// over loops when read.
final class LoopMetrics: Sendable {
    /// Server-side push latency: event created → encoded into the write to its socket.
    let pushLatency = LatencyHistogram()
    /// How long each hold of each shared lock (`SharedLock`) by this loop's thread lasted.
    /// Written only by that thread (a peer that writes for this loop records its holds in
    /// its own), so it needs no lock of its own.
    let lockHolds = LockHolds()
    /// How long each hold of a routing shard by this loop's thread lasted
    /// (`Switchboard.withState`, `withDevices`): its own shard's, taken with no lock while
    /// it owns it, and, rarely, a shard under its fallback lock (those are also in
    /// `lockHolds`' `routingShard`: the only real lock holds of a shard).
    let routingLockHold = LatencyHistogram.routingLockHold()
    /// Steps (`ShardStep`) this loop ran, each in a hold of a shard: with the shards owned
    /// by the loops, all of them of its own shard (`Switchboard.run`).
    let stepsRun = MetricCell()
    /// Steps this loop posted to the inbox of their shard's owner (`EventLoop.postStep`,
    /// `postReceipt`; one that joined a step posted before counts in that one).
    let stepsPosted = MetricCell()
    /// Events written, by frame type (indexed by raw value).
    private let eventsOut: [MetricCell] = (0..<256).map { _ in MetricCell() }
    /// Requests received, by frame type (indexed by raw value).
    private let requestsIn: [MetricCell] = (0..<256).map { _ in MetricCell() }
    /// Handshakes refused with a CLOSE, by close code (index in `CloseCode.allCases`).
    private let refusedHandshakes: [MetricCell] = CloseCode.allCases.map { _ in MetricCell() }
    /// Failed TLS handshakes, by reason (index in `TLSHandshakeFailure.allCases`).
    private let failedTLSHandshakes: [MetricCell] = TLSHandshakeFailure.allCases.map { _ in MetricCell() }
    /// Connections this loop accepted and, their HELLO verified, handed over to their
    /// user's home loop (EventLoop+HandOver.swift).
    let connectionsMoved = MetricCell()

    /// The current time on the monotonic clock that `QueuedEvent.createdNanos` uses.
    @inline(__always)
    static func now() -> UInt64 {
        var time = timespec()
        clock_gettime(CLOCK_MONOTONIC, &time)
        return UInt64(time.tv_sec) &* 1_000_000_000 &+ UInt64(time.tv_nsec)
    }

    /// An event is about to be written at `writtenAt` (one clock read per batch).
    @inline(__always)
    func recordWrite(_ event: QueuedEvent, at writtenAt: UInt64) {
        eventsOut[Int(event.encoded.type.rawValue)].add(1)
        // Events loaded from the store carry no creation instant of this process, and an
        // event that waited for its device to connect measures the device, not the server.
        if event.createdNanos != 0 && !event.waitedForDevice {
            pushLatency.record(nanoseconds: writtenAt &- min(event.createdNanos, writtenAt))
        }
    }

    func recordRequest(_ type: FrameType) {
        requestsIn[Int(type.rawValue)].add(1)
    }

    func recordHandshakeRefused(_ code: CloseCode) {
        guard let index = CloseCode.allCases.firstIndex(of: code) else { return }
        refusedHandshakes[index].add(1)
    }

    func recordTLSHandshakeFailed(_ reason: TLSHandshakeFailure) {
        guard let index = TLSHandshakeFailure.allCases.firstIndex(of: reason) else { return }
        failedTLSHandshakes[index].add(1)
    }

    func tlsHandshakesFailed(_ reason: TLSHandshakeFailure) -> UInt64 {
        TLSHandshakeFailure.allCases.firstIndex(of: reason).map { failedTLSHandshakes[$0].value } ?? 0
    }

    func eventsWritten(_ type: FrameType) -> UInt64 { eventsOut[Int(type.rawValue)].value }
    func requestsReceived(_ type: FrameType) -> UInt64 { requestsIn[Int(type.rawValue)].value }
    func handshakesRefused(_ code: CloseCode) -> UInt64 {
        CloseCode.allCases.firstIndex(of: code).map { refusedHandshakes[$0].value } ?? 0
    }
}

/// One single-writer counter (see `LatencyHistogram`): an object, so that counters can
/// sit in arrays (an `Atomic` cannot be copied into one).
final class MetricCell: Sendable {
    private let storage = Atomic<UInt64>(0)

    /// Adds with a relaxed load and store: correct only while writers never overlap.
    @inline(__always)
    func add(_ amount: UInt64) {
        storage.store(storage.load(ordering: .relaxed) &+ amount, ordering: .relaxed)
    }

    /// Replaces the value (same single-writer rule).
    @inline(__always)
    func set(_ value: UInt64) {
        storage.store(value, ordering: .relaxed)
    }

    var value: UInt64 { storage.load(ordering: .relaxed) }
}

extension LatencyHistogram {
    /// Routing-lock holds: 64 ns to 16.8 ms in powers of two (a hold of one request takes
    /// hundreds of nanoseconds; the unbounded holds this histogram exists to find took
    /// milliseconds).
    static func routingLockHold() -> LatencyHistogram { LatencyHistogram(log2From: 64, buckets: 19) }
}

extension EventLoop {
    /// The event loop whose thread is calling (nil on any other thread: the admin API's, the
    /// store writer's, a test's). Read from the thread-local pointer each loop sets when it
    /// starts running (`shim_set_current_loop`); costs one thread-local load.
    @inline(__always)
    static func onCurrentThread<Result>(_ body: (EventLoop) -> Result) -> Result? {
        guard let pointer = shim_current_loop() else { return nil }
        return Unmanaged<EventLoop>.fromOpaque(pointer)._withUnsafeGuaranteedRef(body)
    }
}
