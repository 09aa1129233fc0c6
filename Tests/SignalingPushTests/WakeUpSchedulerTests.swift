import SignalingSupport
import TestSupport
import Synchronization
import Testing
@testable import SignalingPush

/// The scheduling rules, driven directly with instants (no thread, no HTTP).
@Suite("Wake-up scheduling")
struct WakeUpSchedulerTests {
    let t0 = Instant(nanoseconds: 1_000_000_000_000)
    let counters = PushCounters()

    func scheduler(_ change: (inout PushGatewayConfiguration) -> Void = { _ in }) -> WakeUpScheduler {
        var configuration = PushGatewayConfiguration(endpoint: GatewayEndpoint(host: "127.0.0.1", port: 1, path: "/"))
        configuration.minimumInterval = .seconds(10)
        configuration.minimumBackoff = .seconds(1)
        configuration.maximumBackoff = .seconds(4)
        change(&configuration)
        return WakeUpScheduler(configuration: configuration, counters: counters, idPrefix: "test")
    }

    @Test("a burst for one device is one wake-up: the highest kind and the latest counter")
    func burstCoalesces() throws {
        var scheduler = scheduler()
        for pending in 1...10 {
            scheduler.accept(wakeUp(kind: pending == 4 ? .call : .message, pending: pending), now: t0)
        }
        let attempt = try scheduler.requireDue(now: t0)
        #expect(attempt.wakeUp.kind == .call)
        #expect(attempt.wakeUp.pendingEvents == 10)
        #expect(attempt.number == 1)
        #expect(scheduler.nextDue(now: t0) == nil)
        #expect(counters.coalesced.load(ordering: .relaxed) == 9)
    }

    @Test("devices are scheduled independently, oldest first")
    func devicesIndependent() throws {
        var scheduler = scheduler()
        scheduler.accept(wakeUp(device: "a"), now: t0)
        scheduler.accept(wakeUp(user: "carol", device: "a"), now: t0 + .milliseconds(1))
        let first = try scheduler.requireDue(now: t0 + .milliseconds(1))
        let second = try scheduler.requireDue(now: t0 + .milliseconds(1))
        #expect(first.wakeUp.userID == "bob" && second.wakeUp.userID == "carol")
        #expect(first.id != second.id)
    }

    @Test("after a wake-up, the next one for the device waits for the minimum interval")
    func minimumInterval() throws {
        var scheduler = scheduler()
        scheduler.accept(wakeUp(pending: 1), now: t0)
        let first = try scheduler.requireDue(now: t0)
        scheduler.complete(first.device, .delivered, now: t0 + .milliseconds(50))
        scheduler.accept(wakeUp(pending: 2), now: t0 + .seconds(1))
        scheduler.accept(wakeUp(pending: 3), now: t0 + .seconds(2))
        #expect(scheduler.nextDue(now: t0 + .seconds(2)) == nil)
        #expect(scheduler.nextDue(now: t0 + .milliseconds(9_999)) == nil)
        let second = try scheduler.requireDue(now: t0 + .seconds(10))
        #expect(second.wakeUp.pendingEvents == 3)
        #expect(second.id != first.id)
        #expect(counters.rateLimited.load(ordering: .relaxed) == 1)
        #expect(counters.coalesced.load(ordering: .relaxed) == 1)
        #expect(counters.sent.load(ordering: .relaxed) == 1)
    }

    @Test("a call after a lesser kind is not held by the interval; a call after a call is")
    func callEscalates() throws {
        var scheduler = scheduler()
        scheduler.accept(wakeUp(kind: .message), now: t0)
        let message = try scheduler.requireDue(now: t0)
        scheduler.complete(message.device, .delivered, now: t0)
        scheduler.accept(wakeUp(kind: .receipt), now: t0 + .seconds(1))
        #expect(scheduler.nextDue(now: t0 + .seconds(1)) == nil)
        // The call folds into the deferred receipt and takes it along at once.
        scheduler.accept(wakeUp(kind: .call), now: t0 + .seconds(2))
        let call = try scheduler.requireDue(now: t0 + .seconds(2))
        #expect(call.wakeUp.kind == .call)
        scheduler.complete(call.device, .delivered, now: t0 + .seconds(2))
        scheduler.accept(wakeUp(kind: .call), now: t0 + .seconds(3))
        #expect(scheduler.nextDue(now: t0 + .seconds(3)) == nil)
        #expect(scheduler.nextDue(now: t0 + .seconds(12)) != nil)
    }

    @Test("events arriving during an attempt wait behind it, then for the interval")
    func eventsDuringAttempt() throws {
        var scheduler = scheduler()
        scheduler.accept(wakeUp(pending: 1), now: t0)
        let first = try scheduler.requireDue(now: t0)
        scheduler.accept(wakeUp(pending: 2), now: t0)
        #expect(scheduler.nextDue(now: t0) == nil)
        scheduler.complete(first.device, .delivered, now: t0 + .milliseconds(100))
        #expect(scheduler.nextDue(now: t0 + .milliseconds(100)) == nil)
        let second = try scheduler.requireDue(now: t0 + .seconds(10))
        #expect(second.wakeUp.pendingEvents == 2)
        #expect(counters.rateLimited.load(ordering: .relaxed) == 1)
    }

    @Test("a failed attempt is retried with the same id after back-off, with later events folded in")
    func retryWithBackoff() throws {
        var scheduler = scheduler()
        scheduler.accept(wakeUp(kind: .message, pending: 1), now: t0)
        let first = try scheduler.requireDue(now: t0)
        scheduler.accept(wakeUp(kind: .call, pending: 2), now: t0)
        scheduler.complete(first.device, .failed(retryAfter: nil), now: t0)
        // The first retry waits exactly the minimum back-off (1 s).
        #expect(scheduler.nextDue(now: t0 + .milliseconds(999)) == nil)
        let second = try scheduler.requireDue(now: t0 + .seconds(1))
        #expect(second.id == first.id)
        #expect(second.number == 2)
        #expect(second.wakeUp.kind == .call && second.wakeUp.pendingEvents == 2)
        #expect(jsonObject(second.webhookBody)?["attempt"] as? Int == 2)
        // The second waits between 1 and 2 s.
        let failedAt = t0 + .seconds(1)
        scheduler.complete(second.device, .failed(retryAfter: nil), now: failedAt)
        #expect(scheduler.nextDue(now: failedAt + .milliseconds(999)) == nil)
        let third = try scheduler.requireDue(now: failedAt + .seconds(2))
        #expect(third.number == 3)
        #expect(counters.failedAttempts.load(ordering: .relaxed) == 2)
        #expect(counters.retried.load(ordering: .relaxed) == 2)
    }

    @Test("a wake-up is given up after its last allowed attempt")
    func maxAttempts() throws {
        var scheduler = scheduler { $0.maxAttempts = 3 }
        scheduler.accept(wakeUp(), now: t0)
        var now = t0
        for _ in 1...3 {
            let attempt = try scheduler.requireDue(now: now)
            scheduler.complete(attempt.device, .failed(retryAfter: nil), now: now)
            now = now + .seconds(4)
        }
        #expect(scheduler.nextDue(now: now + .seconds(60)) == nil)
        #expect(counters.failedAttempts.load(ordering: .relaxed) == 3)
        #expect(counters.retried.load(ordering: .relaxed) == 2)
        #expect(counters.droppedExpired.load(ordering: .relaxed) == 1)
        #expect(scheduler.trackedDevices == 0)
    }

    @Test("a wake-up is given up when its retry would start later than the maximum age")
    func maxAge() throws {
        var scheduler = scheduler { $0.maxAge = .milliseconds(1_500) }
        scheduler.accept(wakeUp(), now: t0)
        let first = try scheduler.requireDue(now: t0)
        scheduler.complete(first.device, .failed(retryAfter: nil), now: t0)  // retry at 1 s: within
        let second = try scheduler.requireDue(now: t0 + .seconds(1))
        scheduler.complete(second.device, .failed(retryAfter: nil), now: t0 + .seconds(1))  // ≥ 2 s: too late
        #expect(counters.droppedExpired.load(ordering: .relaxed) == 1)
        #expect(scheduler.nextDue(now: t0 + .seconds(60)) == nil)
    }

    @Test("a rejected wake-up is not retried")
    func rejectedNotRetried() throws {
        var scheduler = scheduler()
        scheduler.accept(wakeUp(), now: t0)
        let attempt = try scheduler.requireDue(now: t0)
        scheduler.complete(attempt.device, .rejected(reason: "400"), now: t0)
        #expect(scheduler.nextDue(now: t0 + .seconds(3600)) == nil)
        #expect(counters.rejected.load(ordering: .relaxed) == 1)
        #expect(counters.failedAttempts.load(ordering: .relaxed) == 1)
        #expect(counters.retried.load(ordering: .relaxed) == 0)
    }

    @Test("Retry-After delays the retry, capped at the maximum back-off")
    func retryAfter() throws {
        var scheduler = scheduler { $0.maximumBackoff = .seconds(30) }
        scheduler.accept(wakeUp(), now: t0)
        let first = try scheduler.requireDue(now: t0)
        scheduler.complete(first.device, .failed(retryAfter: .seconds(20)), now: t0)
        #expect(scheduler.nextDue(now: t0 + .milliseconds(19_999)) == nil)
        let second = try scheduler.requireDue(now: t0 + .seconds(20))
        scheduler.complete(second.device, .failed(retryAfter: .seconds(3600)), now: t0 + .seconds(20))
        #expect(scheduler.nextDue(now: t0 + .seconds(49)) == nil)
        #expect(scheduler.nextDue(now: t0 + .seconds(50)) != nil)
    }

    @Test("beyond the device cap new devices are dropped; tracked ones still coalesce")
    func deviceCap() throws {
        var scheduler = scheduler { $0.maxQueuedDevices = 3 }
        for device in ["a", "b", "c", "d", "e"] { scheduler.accept(wakeUp(device: device), now: t0) }
        scheduler.accept(wakeUp(device: "a", pending: 7), now: t0)
        #expect(scheduler.trackedDevices == 3)
        #expect(counters.droppedQueueFull.load(ordering: .relaxed) == 2)
        #expect(counters.coalesced.load(ordering: .relaxed) == 1)
        var devices: [String: Int] = [:]
        while let attempt = scheduler.nextDue(now: t0) { devices[attempt.wakeUp.deviceID] = attempt.wakeUp.pendingEvents }
        #expect(devices == ["a": 7, "b": 1, "c": 1])
    }

    @Test("a wake-up whose body would exceed the cap is dropped, not sent")
    func oversize() throws {
        var scheduler = scheduler()
        scheduler.accept(wakeUp(device: "big", token: [UInt8](repeating: 0xAB, count: 2100)), now: t0)  // 4200 hex digits
        scheduler.accept(wakeUp(device: "text", token: [UInt8](repeating: UInt8(ascii: "x"), count: 3800)), now: t0)
        let attempt = try scheduler.requireDue(now: t0)
        #expect(attempt.wakeUp.deviceID == "text")
        #expect(attempt.webhookBody.count <= 4096)
        #expect(scheduler.nextDue(now: t0) == nil)
        #expect(counters.droppedOversize.load(ordering: .relaxed) == 1)
    }

    @Test("a device is forgotten once its interval has passed")
    func forgetsIdleDevices() throws {
        var scheduler = scheduler()
        for index in 0..<100 { scheduler.accept(wakeUp(device: "d\(index)"), now: t0) }
        while let attempt = scheduler.nextDue(now: t0) { scheduler.complete(attempt.device, .delivered, now: t0) }
        #expect(scheduler.trackedDevices == 100)
        #expect(scheduler.nextDue(now: t0 + .seconds(10)) == nil)
        #expect(scheduler.trackedDevices == 0)
    }

    @Test("removing everything counts waiting and in-flight wake-ups")
    func removeAll() throws {
        var scheduler = scheduler()
        scheduler.accept(wakeUp(device: "a"), now: t0)
        _ = try scheduler.requireDue(now: t0)
        scheduler.accept(wakeUp(device: "a"), now: t0)  // waits behind the attempt
        scheduler.accept(wakeUp(device: "b"), now: t0)
        #expect(scheduler.removeAll() == 3)
        #expect(scheduler.trackedDevices == 0)
        #expect(scheduler.nextDue(now: t0) == nil)
    }
}

extension WakeUpScheduler {
    /// The attempt due at `now`, or a test failure.
    mutating func requireDue(now: Instant, sourceLocation: SourceLocation = #_sourceLocation) throws -> Attempt {
        guard let attempt = nextDue(now: now) else {
            Issue.record("no attempt due at \(now)", sourceLocation: sourceLocation)
            throw TestFailure("no attempt due")
        }
        return attempt
    }
}

@Suite("Retry back-off")
struct RetryPolicyTests {
    let policy = RetryPolicy(minimumBackoff: .seconds(1), maximumBackoff: .seconds(300), maxAttempts: 10, maxAge: .seconds(900))

    @Test("the ceiling doubles from the minimum and stops at the maximum")
    func ceiling() {
        #expect(policy.ceiling(afterFailures: 1) == .seconds(1))
        #expect(policy.ceiling(afterFailures: 2) == .seconds(2))
        #expect(policy.ceiling(afterFailures: 5) == .seconds(16))
        #expect(policy.ceiling(afterFailures: 9) == .seconds(256))
        #expect(policy.ceiling(afterFailures: 10) == .seconds(300))
        #expect(policy.ceiling(afterFailures: 1_000) == .seconds(300))
    }

    @Test("delays are spread over [minimum, ceiling] (full jitter)")
    func jitter() {
        var random = SystemRandomNumberGenerator()
        var delays: [Duration] = []
        for _ in 0..<500 { delays.append(policy.delay(afterFailures: 6, using: &random)) }
        #expect(delays.allSatisfy { $0 >= .seconds(1) && $0 <= .seconds(32) })
        #expect(delays.contains { $0 < .seconds(8) } && delays.contains { $0 > .seconds(24) })
    }

    @Test("Retry-After in seconds is read; dates and garbage are ignored")
    func retryAfterHeader() {
        #expect(RetryPolicy.retryAfter(header: "120") == .seconds(120))
        #expect(RetryPolicy.retryAfter(header: " 7 ") == .seconds(7))
        #expect(RetryPolicy.retryAfter(header: "Wed, 21 Oct 2015 07:28:00 GMT") == nil)
        #expect(RetryPolicy.retryAfter(header: "-1") == nil)
        #expect(RetryPolicy.retryAfter(header: nil) == nil)
    }
}
