import CLinuxShims
import SignalingSupport
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

// Locks of this file (docs/ARCHITECTURE.md, "Locks"): only `credentials`, a leaf taken on
// a reload and by the gateway's thread after each wake. Submissions take no lock: `queue`
// is a lock-free `MPSCQueue` and `waiting` an atomic count.
//
// Ownership: any thread pushes (`add`); only the gateway's thread takes (`takeAll`) and
// closes (`close`) while it runs; once it has exited (joined) or before it ever started,
// the thread that stops the gateway is the consumer instead (`PushGateway.stop`).

/// The one place other threads reach into the gateway: a lock-free inbox of wake-ups and
/// the eventfd that wakes the gateway's thread. Shared by `PushGateway` (writers) and
/// `GatewayLoop` (the reader), so the loop needs no reference back to the gateway.
///
/// A submission is one atomic add (`waiting`) and one push (one allocation and one
/// compare-and-exchange); only the push that finds the queue empty writes the eventfd (one
/// wake-up per batch, as the store writer's inbox does). Nothing is coalesced here: the
/// gateway's thread folds each batch per device when it takes it (`WakeUpCoalescer`), so
/// a burst for one device costs one entry per submission until the gateway takes it.
final class GatewayInbox: Sendable {
    private let queue = MPSCQueue<WakeUp>()
    /// Submissions queued (or being queued) and not yet taken by the gateway's thread: a
    /// submitter adds 1 before its push (and takes it back if refused), the consumer
    /// subtracts what it took after the take. So it never undercounts what is queued, and
    /// `add` refuses once `capacity` are waiting: the inbox holds at most `capacity`
    /// wake-ups whatever the number of submitting threads.
    private let waiting = Atomic<Int>(0)
    /// Readable when the inbox has something new or a stop was requested.
    let wakeFD: Int32
    private let capacity: Int

    init(capacity: Int) throws(PushGatewayError) {
        let fd = shim_eventfd()
        guard fd >= 0 else { throw PushGatewayError("cannot create an eventfd: \(String(cString: strerror(errno)))") }
        wakeFD = fd
        self.capacity = capacity
    }

    deinit { Glibc.close(wakeFD) }

    /// What `add` did.
    enum Admission: Equatable {
        /// Queued for the gateway's thread.
        case queued
        /// `capacity` submissions are waiting for the gateway's thread already.
        case full
        /// The gateway has stopped.
        case closed
    }

    /// Any thread: queues `wakeUp` for the gateway's thread, unless `capacity` submissions
    /// are waiting or the inbox is closed.
    func add(_ wakeUp: WakeUp) -> Admission {
        // Reserve a place before pushing, so that submitters racing for the last place
        // cannot overshoot it: one of them sees the count at capacity and gives it back.
        guard waiting.wrappingAdd(1, ordering: .relaxed).oldValue < capacity else {
            waiting.wrappingSubtract(1, ordering: .relaxed)
            return .full
        }
        switch queue.push(wakeUp) {
        case .queuedFirst:
            // One eventfd write per batch: the gateway's thread has not emptied the queue
            // since an earlier push, which did write it.
            shim_eventfd_signal(wakeFD)
            return .queued
        case .queued:
            return .queued
        case .refused:
            waiting.wrappingSubtract(1, ordering: .relaxed)
            return .closed
        }
    }

    /// Consumer only (the gateway's thread, when `wakeFD` is readable): appends every
    /// wake-up queued to `batch`, in the order each submitter queued them.
    func takeAll(appendingTo batch: inout [WakeUp]) {
        shim_eventfd_drain(wakeFD)
        let before = batch.count
        queue.takeAll(appendingTo: &batch)
        waiting.wrappingSubtract(batch.count - before, ordering: .relaxed)
    }

    /// Consumer only: refuses every later submission; returns how many wake-ups were still
    /// waiting (dropped). Closing twice returns 0 the second time.
    func close() -> Int {
        var left: [WakeUp] = []
        queue.close(appendingTo: &left)
        waiting.wrappingSubtract(left.count, ordering: .relaxed)
        return left.count
    }

    /// Submissions waiting for the gateway's thread (any thread, as a hint).
    var waitingCount: Int { waiting.load(ordering: .relaxed) }

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
