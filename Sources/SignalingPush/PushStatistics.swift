import Synchronization

/// A snapshot of the gateway's counters (docs/PUSH.md, "What is counted").
///
/// Every `submit` ends up in exactly one of: a new wake-up, `coalesced` into a wake-up
/// already waiting for the device, or `droppedQueueFull` / `droppedStopped` at once.
/// Every wake-up ends as `sent`, `rejected`, or one of the other `dropped…` counters,
/// unless it is still pending.
public struct PushStatistics: Sendable, Equatable, CustomStringConvertible {
    /// `submit` calls.
    public var submitted = 0
    /// Submissions merged into a wake-up already waiting for the same device (counted on
    /// the gateway's thread when it takes them from the inbox).
    public var coalesced = 0
    /// Wake-ups held back by the per-device minimum interval (counted once each).
    public var rateLimited = 0
    /// Wake-ups the gateway accepted (2xx).
    public var sent = 0
    /// Attempts that failed: connection error, timeout, 5xx, 429, or a 4xx.
    public var failedAttempts = 0
    /// Failed attempts that were scheduled again with back-off.
    public var retried = 0
    /// Wake-ups the gateway refused with a 4xx other than 408/429: not retried.
    public var rejected = 0
    /// Wake-ups whose JSON body would exceed the size cap: never sent.
    public var droppedOversize = 0
    /// Submissions refused because `maxQueuedDevices` submissions were waiting in the
    /// inbox for the gateway's thread, and wake-ups for a new device while
    /// `maxQueuedDevices` devices were tracked.
    public var droppedQueueFull = 0
    /// Wake-ups given up after `maxAttempts` failures or past `maxAge`, and calls whose
    /// ring was over before their push could go.
    public var droppedExpired = 0
    /// Wake-ups none of whose device's registrations a configured service can carry
    /// (a message for a device with only a VoIP token, an FCM token without FCM).
    public var droppedUnroutable = 0
    /// Tokens the service declared invalid (also counted in `rejected`): removed from
    /// the device and the store.
    public var tokensRemoved = 0
    /// Wake-ups submitted after `stop`, or still waiting or in flight when it ran.
    public var droppedStopped = 0
    /// Requests on the wire right now.
    public var inFlight = 0
    /// `rejected` by reason, "service:reason" (bounded; see `PushCounters`).
    public var rejectionReasons: [String: Int] = [:]

    /// Every wake-up dropped for any reason (rejections are counted separately).
    public var dropped: Int { droppedOversize + droppedQueueFull + droppedExpired + droppedStopped + droppedUnroutable }

    public init() {}

    public var description: String {
        "submitted=\(submitted) coalesced=\(coalesced) rateLimited=\(rateLimited) sent=\(sent) "
            + "failedAttempts=\(failedAttempts) retried=\(retried) rejected=\(rejected) "
            + "droppedOversize=\(droppedOversize) droppedQueueFull=\(droppedQueueFull) "
            + "droppedExpired=\(droppedExpired) droppedStopped=\(droppedStopped) droppedUnroutable=\(droppedUnroutable) "
            + "tokensRemoved=\(tokensRemoved) inFlight=\(inFlight)"
    }
}

/// The live counters: relaxed atomics written by `submit` callers and the gateway's
/// thread, read by anyone through `snapshot()`.
final class PushCounters: Sendable {
    let submitted = Atomic<Int>(0)
    let coalesced = Atomic<Int>(0)
    let rateLimited = Atomic<Int>(0)
    let sent = Atomic<Int>(0)
    let failedAttempts = Atomic<Int>(0)
    let retried = Atomic<Int>(0)
    let rejected = Atomic<Int>(0)
    let droppedOversize = Atomic<Int>(0)
    let droppedQueueFull = Atomic<Int>(0)
    let droppedExpired = Atomic<Int>(0)
    let droppedStopped = Atomic<Int>(0)
    let droppedUnroutable = Atomic<Int>(0)
    let tokensRemoved = Atomic<Int>(0)
    let inFlight = Atomic<Int>(0)
    /// Rejections and invalid tokens by the service's reason ("apns:BadDeviceToken",
    /// "fcm:UNREGISTERED", "webhook:404"): at most `maxReasons` distinct ones, the rest
    /// under "other", so a service inventing reasons cannot grow it.
    private let reasons = Mutex<[String: Int]>([:])
    static let maxReasons = 64

    func countRejection(_ reason: String) {
        reasons.withLock { counts in
            let key = counts[reason] != nil || counts.count < Self.maxReasons ? reason : "other"
            counts[key, default: 0] += 1
        }
    }

    func snapshot() -> PushStatistics {
        var s = PushStatistics()
        s.submitted = submitted.load(ordering: .relaxed)
        s.coalesced = coalesced.load(ordering: .relaxed)
        s.rateLimited = rateLimited.load(ordering: .relaxed)
        s.sent = sent.load(ordering: .relaxed)
        s.failedAttempts = failedAttempts.load(ordering: .relaxed)
        s.retried = retried.load(ordering: .relaxed)
        s.rejected = rejected.load(ordering: .relaxed)
        s.droppedOversize = droppedOversize.load(ordering: .relaxed)
        s.droppedQueueFull = droppedQueueFull.load(ordering: .relaxed)
        s.droppedExpired = droppedExpired.load(ordering: .relaxed)
        s.droppedStopped = droppedStopped.load(ordering: .relaxed)
        s.droppedUnroutable = droppedUnroutable.load(ordering: .relaxed)
        s.tokensRemoved = tokensRemoved.load(ordering: .relaxed)
        s.rejectionReasons = reasons.withLock { $0 }
        s.inFlight = inFlight.load(ordering: .relaxed)
        return s
    }
}

extension Atomic<Int> {
    func increment(by amount: Int = 1) { wrappingAdd(amount, ordering: .relaxed) }
}
