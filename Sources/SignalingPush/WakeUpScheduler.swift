import SignalingStore
import SignalingSupport

/// Decides which wake-up goes out when: coalescing per device, the per-device minimum
/// interval, retries with back-off, give-up rules and the bound on tracked devices.
///
/// Pure bookkeeping on instants it is given (no clock, no I/O), so tests drive it
/// directly. Confined to the gateway's thread: it is not thread-safe and needs no lock.
///
/// A device is tracked while it has a wake-up waiting or in flight, and afterwards until
/// its minimum interval has passed (to enforce it). Per device:
///
/// - `waiting`: the wake-up to send next, with everything submitted since folded in;
/// - `sending`: the wake-up on the wire; events arriving meanwhile wait behind it;
/// - `lastStart`: when (and with which kind) the last attempt started.
struct WakeUpScheduler {
    /// One request to make, as the HTTP layer needs it.
    struct Attempt {
        var device: DeviceKey
        var wakeUp: WakeUp
        /// The registration `PushRouting` chose for this attempt (an invalid-token answer
        /// removes exactly this one).
        var registration: PushRegistration
        /// Same for every attempt of one wake-up, so the gateway may de-duplicate.
        var id: String
        /// 1 for the first attempt.
        var number: Int
        var request: PushRequest
    }

    /// How an attempt ended.
    enum Outcome: Equatable {
        /// 2xx.
        case delivered
        /// Connection error, timeout, 5xx, 408 or 429: retry with back-off, no earlier
        /// than `retryAfter` when the gateway said so.
        case failed(retryAfter: Duration?)
        /// Any other 4xx (or an unexpected status): not retried. `reason` is the
        /// service's (APNs `reason`, FCM `errorCode`) or the status.
        case rejected(reason: String)
        /// The service says the token is no longer valid (APNs 410, Unregistered,
        /// BadDeviceToken; FCM 404, UNREGISTERED): not retried, and the token is removed.
        case tokenInvalid(reason: String)
    }

    private struct PendingWakeUp {
        var wakeUp: WakeUp
        var serial: UInt64
        /// Failed attempts so far.
        var failures: Int
        var queuedAt: Instant
        /// When a call was first folded in: its push is worthless `callLifetime` later.
        var callSince: Instant?
    }

    private struct DeviceState {
        var waiting: PendingWakeUp?
        var sending: PendingWakeUp?
        var lastStart: (at: Instant, kind: WakeUpKind)?
        /// The deadline of this device's live heap entry, if any, and that entry's stamp.
        var scheduledAt: Instant?
        var stamp: UInt64 = 0
    }

    let minimumInterval: Duration
    let retry: RetryPolicy
    let maxDevices: Int
    let maxBodyBytes: Int
    /// Distinguishes this gateway's wake-up ids from those of earlier runs.
    let idPrefix: String
    let counters: PushCounters
    let routing: PushRouting
    let builder: PushRequestBuilder
    let callLifetime: Duration

    private var devices: [DeviceKey: DeviceState] = [:]
    private var heap = DeadlineHeap<Instant, DeviceKey, UInt64>()
    private var nextStamp: UInt64 = 1
    private var nextSerial: UInt64 = 1
    private var random = SystemRandomNumberGenerator()

    init(configuration: PushGatewayConfiguration, counters: PushCounters, idPrefix: String) {
        minimumInterval = configuration.minimumInterval
        retry = RetryPolicy(configuration)
        maxDevices = configuration.maxQueuedDevices
        maxBodyBytes = configuration.maxBodyBytes
        self.idPrefix = idPrefix
        self.counters = counters
        routing = configuration.routing
        builder = PushRequestBuilder(webhookMaxBody: configuration.maxBodyBytes, apnsDefaultTopic: configuration.apns?.defaultTopic ?? "")
        callLifetime = configuration.callLifetime
    }

    /// Devices tracked (waiting, in flight, or inside their minimum interval).
    var trackedDevices: Int { devices.count }

    /// Takes a wake-up from the inbox.
    mutating func accept(_ wakeUp: WakeUp, now: Instant) {
        let key = wakeUp.device
        guard var state = devices[key] else {
            guard devices.count < maxDevices else {
                counters.droppedQueueFull.increment()
                return
            }
            var state = DeviceState()
            state.waiting = newWakeUp(wakeUp, now: now)
            schedule(&state, key, at: now)
            devices[key] = state
            return
        }
        if var waiting = state.waiting {
            waiting.wakeUp.absorb(wakeUp)
            if wakeUp.kind == .call && waiting.callSince == nil { waiting.callSince = now }
            state.waiting = waiting
            counters.coalesced.increment()
            // A call folded into a message deferred by the interval may go at once; a
            // retry keeps its back-off whatever the kind.
            if state.sending == nil, waiting.failures == 0 {
                let due = earliestStart(waiting.wakeUp.kind, state, now: now)
                if let scheduled = state.scheduledAt, due < scheduled { schedule(&state, key, at: due) }
            }
        } else {
            state.waiting = newWakeUp(wakeUp, now: now)
            // Behind a wake-up in flight, it is scheduled when that one completes.
            if state.sending == nil { scheduleNew(&state, key, now: now) }
        }
        devices[key] = state
    }

    /// The next attempt to start now, if any is due. The caller limits concurrency by
    /// not asking. A wake-up whose body would exceed the size cap is dropped here.
    /// `wallSeconds` is the wall clock now (APNs expirations are absolute).
    mutating func nextDue(now: Instant, wallSeconds: UInt64 = 0) -> Attempt? {
        while let top = heap.first, top.deadline <= now {
            heap.popFirst()
            guard var state = devices[top.key], state.stamp == top.stamp else { continue }  // stale
            state.scheduledAt = nil
            guard state.sending == nil, let pending = state.waiting else {
                // Nothing left to send and the interval is over: forget the device.
                if state.sending == nil && state.waiting == nil { devices[top.key] = nil } else { devices[top.key] = state }
                continue
            }
            let id = "\(idPrefix).\(pending.serial)"
            state.waiting = nil
            var callRemaining: Duration?
            if pending.wakeUp.kind == .call {
                let remaining = (pending.callSince ?? pending.queuedAt) + callLifetime - now
                // A stale ring must never arrive: past the ring timeout the call is over.
                guard remaining > .zero else {
                    counters.droppedExpired.increment()
                    scheduleForget(&state, top.key)
                    devices[top.key] = state
                    continue
                }
                callRemaining = remaining
            }
            guard let route = routing.route(pending.wakeUp.kind, pending.wakeUp.registrations) else {
                counters.droppedUnroutable.increment()
                scheduleForget(&state, top.key)
                devices[top.key] = state
                continue
            }
            guard let request = builder.request(
                for: pending.wakeUp, registration: route.registration, service: route.service, id: id,
                attempt: pending.failures + 1, callRemaining: callRemaining, wallSeconds: wallSeconds)
            else {
                counters.droppedOversize.increment()
                scheduleForget(&state, top.key)
                devices[top.key] = state
                continue
            }
            state.sending = pending
            state.lastStart = (now, pending.wakeUp.kind)
            devices[top.key] = state
            return Attempt(
                device: top.key, wakeUp: pending.wakeUp, registration: route.registration, id: id, number: pending.failures + 1,
                request: request)
        }
        compactHeapIfMostlyStale()
        return nil
    }

    /// Records how the attempt for `device` ended.
    mutating func complete(_ device: DeviceKey, _ outcome: Outcome, now: Instant) {
        guard var state = devices[device], let sending = state.sending else { return }
        state.sending = nil
        switch outcome {
        case .delivered:
            counters.sent.increment()
        case .rejected:
            counters.failedAttempts.increment()
            counters.rejected.increment()
        case .tokenInvalid:
            counters.failedAttempts.increment()
            counters.rejected.increment()
            counters.tokensRemoved.increment()
        case .failed(let retryAfter):
            counters.failedAttempts.increment()
            var again = sending
            again.failures += 1
            if let later = state.waiting {
                // Events that arrived during the attempt ride along with the retry.
                again.wakeUp.absorb(later.wakeUp)
                if again.callSince == nil { again.callSince = later.callSince }
                counters.coalesced.increment()
                state.waiting = nil
            }
            let due = now + retry.delay(afterFailures: again.failures, retryAfter: retryAfter, using: &random)
            if again.failures >= retry.maxAttempts || due - again.queuedAt > retry.maxAge {
                counters.droppedExpired.increment()
                scheduleForget(&state, device)
            } else {
                counters.retried.increment()
                state.waiting = again
                schedule(&state, device, at: due)
            }
            devices[device] = state
            return
        }
        if state.waiting != nil {
            scheduleNew(&state, device, now: now)
        } else {
            scheduleForget(&state, device)
        }
        devices[device] = state
    }

    /// Forgets everything (the gateway is stopping). Returns the wake-ups dropped:
    /// waiting ones and those in flight.
    mutating func removeAll() -> Int {
        var dropped = 0
        for state in devices.values {
            if state.waiting != nil { dropped += 1 }
            if state.sending != nil { dropped += 1 }
        }
        devices = [:]
        heap.removeAll()
        return dropped
    }

    // MARK: - Scheduling

    private mutating func newWakeUp(_ wakeUp: WakeUp, now: Instant) -> PendingWakeUp {
        defer { nextSerial += 1 }
        return PendingWakeUp(wakeUp: wakeUp, serial: nextSerial, failures: 0, queuedAt: now, callSince: wakeUp.kind == .call ? now : nil)
    }

    /// The earliest start of a new wake-up of `kind`: the minimum interval after the last
    /// start, except that a call following a lesser kind goes at once (a ringing call
    /// cannot wait for the interval; a second call can).
    private func earliestStart(_ kind: WakeUpKind, _ state: DeviceState, now: Instant) -> Instant {
        guard let last = state.lastStart else { return now }
        if kind == .call && last.kind != .call { return now }
        return max(now, last.at + minimumInterval)
    }

    /// Schedules a new (never attempted) waiting wake-up, counting it when the interval
    /// holds it back.
    private mutating func scheduleNew(_ state: inout DeviceState, _ key: DeviceKey, now: Instant) {
        guard let waiting = state.waiting else { return }
        let due = earliestStart(waiting.wakeUp.kind, state, now: now)
        if due > now { counters.rateLimited.increment() }
        schedule(&state, key, at: due)
    }

    /// Keeps an idle device until its interval has passed, then forgets it.
    private mutating func scheduleForget(_ state: inout DeviceState, _ key: DeviceKey) {
        if let last = state.lastStart, minimumInterval > .zero {
            schedule(&state, key, at: last.at + minimumInterval)
        } else {
            // Never started (dropped before an attempt) or no interval: forget at the
            // next look.
            schedule(&state, key, at: Instant(nanoseconds: 0))
        }
    }

    private mutating func schedule(_ state: inout DeviceState, _ key: DeviceKey, at deadline: Instant) {
        state.stamp = nextStamp
        nextStamp += 1
        state.scheduledAt = deadline
        heap.insert(.init(deadline: deadline, key: key, stamp: state.stamp))
    }

    /// Rescheduling leaves stale heap entries behind until their deadline; rebuild when
    /// they outnumber the live ones, so the heap stays proportional to the devices.
    private mutating func compactHeapIfMostlyStale() {
        guard heap.count > 2 * devices.count + 1024 else { return }
        var live: [DeadlineHeap<Instant, DeviceKey, UInt64>.Entry] = []
        live.reserveCapacity(devices.count)
        for (key, state) in devices {
            if let at = state.scheduledAt { live.append(.init(deadline: at, key: key, stamp: state.stamp)) }
        }
        heap.replaceAll(with: live)
    }
}
