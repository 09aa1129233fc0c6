import CLinuxShims
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

// Locks of this file (docs/ARCHITECTURE.md, "Locks"): `entries` and `credentials` are
// leaves, never held together. `entries` is taken by every event loop and the store writer
// for each wake-up they submit (after their routing shard's lock is released) and by the
// gateway's thread to take the batch; `credentials` on a reload. Holds of `entries` are
// timed when the gateway's owner asks (`PushGateway.init(submissionHolds:)`: the server's
// `push_inbox` lock label).

/// The one place other threads reach into the gateway: a locked, coalescing inbox and the
/// eventfd that wakes the gateway's thread. Shared by `PushGateway` (writers) and
/// `GatewayLoop` (the reader), so the loop needs no reference back to the gateway.
final class GatewayInbox: Sendable {
    private let entries = Mutex(SubmissionInbox())
    /// Readable when the inbox has something new or a stop was requested.
    let wakeFD: Int32
    private let capacity: Int
    /// Called after each hold of `entries` with its length in nanoseconds, on the thread
    /// that held it (nil: holds are not timed).
    private let holds: (@Sendable (UInt64) -> Void)?

    init(capacity: Int, holds: (@Sendable (UInt64) -> Void)? = nil) throws(PushGatewayError) {
        let fd = shim_eventfd()
        guard fd >= 0 else { throw PushGatewayError("cannot create an eventfd: \(String(cString: strerror(errno)))") }
        wakeFD = fd
        self.capacity = capacity
        self.holds = holds
    }

    /// Runs `body` under the lock of `entries`, timing the hold when `holds` is set: one
    /// monotonic clock read after taking the lock and one before releasing it.
    @inline(__always)
    private func withEntries<Result>(_ body: (inout SubmissionInbox) -> sending Result) -> sending Result {
        guard let holds else { return entries.withLock { body(&$0) } }
        var hold: (start: UInt64, end: UInt64) = (0, 0)
        let result = entries.withLock { inbox -> sending Result in
            hold.start = Self.monotonicNanoseconds()
            defer { hold.end = Self.monotonicNanoseconds() }
            return body(&inbox)
        }
        holds(hold.end &- hold.start)
        return result
    }

    private static func monotonicNanoseconds() -> UInt64 {
        var time = timespec()
        clock_gettime(CLOCK_MONOTONIC, &time)
        return UInt64(time.tv_sec) &* 1_000_000_000 &+ UInt64(time.tv_nsec)
    }

    deinit { close(wakeFD) }

    func add(_ wakeUp: WakeUp) -> SubmissionInbox.Admission {
        let admission = withEntries { $0.add(wakeUp, capacity: capacity) }
        // One eventfd write per batch: a thread that has not emptied the inbox yet will
        // see the new entry anyway.
        if case .added(wasEmpty: true) = admission { shim_eventfd_signal(wakeFD) }
        return admission
    }

    /// On the gateway's thread, when `wakeFD` is readable.
    func takeAll() -> [WakeUp] {
        shim_eventfd_drain(wakeFD)
        // Swap under the lock, copy and free outside it: submitters never wait for a batch.
        let taken = withEntries { $0.takeAll() }
        return taken.wakeUps
    }

    /// Refuses every later submission; returns how many wake-ups were still waiting.
    func refuseFurtherSubmissions() -> Int {
        entries.withLock { $0.close() }.count
    }

    func wake() { shim_eventfd_signal(wakeFD) }

    /// Signing material waiting for the loop (a reload); the later of two replacements of
    /// the same service wins.
    private let credentials = Mutex(PushCredentials())

    /// Any thread: hands new signing material to the loop and wakes it.
    func replaceCredentials(_ replacement: PushCredentials) {
        credentials.withLock { waiting in
            if let apns = replacement.apns { waiting.apns = apns }
            if let fcm = replacement.fcm { waiting.fcm = fcm }
        }
        wake()
    }

    /// On the gateway's thread: the signing material to put in force, if any.
    func takeCredentials() -> PushCredentials? {
        let taken = credentials.withLock { waiting -> PushCredentials in
            defer { waiting = PushCredentials() }
            return waiting
        }
        return taken.apns == nil && taken.fcm == nil ? nil : taken
    }
}

/// New signing material for the providers (a reload): only the APNs key, key id and
/// team id, and the FCM service account, are taken from these; endpoints are fixed at start.
struct PushCredentials: Sendable {
    var apns: APNsConfiguration?
    var fcm: FCMConfiguration?
}
