import SignalingProtocol
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// A latency histogram with fixed bucket bounds (seconds, Prometheus `le`), updated by one
/// writer at a time and read by anyone.
///
/// Cost: an update is a short linear scan over at most 16 bounds and three relaxed
/// load/store pairs, no read-modify-write and no lock. That is only correct because
/// writers never overlap: each histogram belongs to one event loop (whose state, and
/// therefore this, is touched only while its `ownership` lock is held, by its own thread
/// or a peer writing for it) or to the store writer's thread. Readers may see a bucket
/// updated a moment before `sum` and `count`: a scrape is a snapshot, not a transaction.
final class LatencyHistogram: Sendable {
    /// Upper bounds in nanoseconds, ascending; an implicit +Inf bucket follows.
    let bounds: [UInt64]
    private let buckets: [MetricCell]
    private let sumNanoseconds = MetricCell()
    private let total = MetricCell()

    /// 5 µs to 10 s: server-side push latency lives in the first third (most pushes take
    /// under 25 µs on an idle loop), store commits in the rest.
    static let defaultBounds: [UInt64] = [
        5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 2_500_000, 5_000_000, 10_000_000, 25_000_000,
        50_000_000, 100_000_000, 250_000_000, 1_000_000_000, 5_000_000_000, 10_000_000_000,
    ]

    init(bounds: [UInt64] = LatencyHistogram.defaultBounds) {
        self.bounds = bounds
        self.buckets = (0...bounds.count).map { _ in MetricCell() }
    }

    /// Records one observation (single writer at a time; see the type's comment).
    @inline(__always)
    func record(nanoseconds: UInt64) {
        var index = 0
        while index < bounds.count && nanoseconds > bounds[index] { index += 1 }
        buckets[index].add(1)
        sumNanoseconds.add(nanoseconds)
        total.add(1)
    }

    /// Per-bucket counts (not cumulative; the last one is +Inf), the sum in nanoseconds
    /// and the count.
    func snapshot() -> HistogramSnapshot {
        HistogramSnapshot(
            bounds: bounds, counts: buckets.map(\.value), sumNanoseconds: sumNanoseconds.value, count: total.value)
    }
}

/// A histogram read at one moment; several (one per loop) add up.
struct HistogramSnapshot: Sendable {
    var bounds: [UInt64]
    var counts: [UInt64]
    var sumNanoseconds: UInt64
    var count: UInt64

    static func + (a: HistogramSnapshot, b: HistogramSnapshot) -> HistogramSnapshot {
        HistogramSnapshot(
            bounds: a.bounds, counts: zip(a.counts, b.counts).map { $0 &+ $1 },
            sumNanoseconds: a.sumNanoseconds &+ b.sumNanoseconds, count: a.count &+ b.count)
    }
}

/// Counters and histograms of one event loop, for `/metrics`. Same single-writer rule as
/// `LatencyHistogram`: updated only under the loop's `ownership`, summed over loops when
/// read.
final class LoopMetrics: Sendable {
    /// Server-side push latency: event created → encoded into the write to its socket.
    let pushLatency = LatencyHistogram()
    /// Events written, by frame type (indexed by raw value).
    private let eventsOut: [MetricCell] = (0..<256).map { _ in MetricCell() }
    /// Requests received, by frame type (indexed by raw value).
    private let requestsIn: [MetricCell] = (0..<256).map { _ in MetricCell() }
    /// Handshakes refused with a CLOSE, by close code (index in `CloseCode.allCases`).
    private let refusedHandshakes: [MetricCell] = CloseCode.allCases.map { _ in MetricCell() }
    /// Failed TLS handshakes, by reason (index in `TLSHandshakeFailure.allCases`).
    private let failedTLSHandshakes: [MetricCell] = TLSHandshakeFailure.allCases.map { _ in MetricCell() }

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

    var value: UInt64 { storage.load(ordering: .relaxed) }
}
