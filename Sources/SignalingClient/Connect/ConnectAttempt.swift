import Foundation
import Synchronization
import SignalingSupport

/// One run of the connect-then-mark flow of the seed digest (§3): the TCP connect and the
/// HELLO/WELCOME handshake run on a background thread while the calling thread waits on
/// a Foundation `NSConditionLock` with a deadline.
///
/// Lock discipline (why this class is `@unchecked Sendable`): the attempt thread takes
/// `lock` before it starts and holds it for the whole attempt, then releases it with
/// condition `finished`. `outcome` is written only by that thread while it holds the
/// lock, and read or claimed only by waiters that acquired the lock in condition
/// `finished`. Cancellation does not need the lock: it is an atomic flag plus a wake-up
/// descriptor the attempt thread polls alongside its socket.
final class ConnectAttempt: @unchecked Sendable {
    /// The conditions of `lock`. The article names them "connecting" and "connected";
    /// ours calls the second `finished` because a refused or rejected attempt must wake
    /// the caller as promptly as a successful one, instead of leaving it waiting for its
    /// deadline. `outcome` says which it was.
    enum Condition: Int {
        /// The background thread is connecting and handshaking; it holds the lock.
        case connecting = 0
        /// The background thread is done and has released the lock; `outcome` is set.
        case finished = 1
        /// The owning waiter marked and handed over the connection (or gave up):
        /// `settlement` is set. Other callers of `connect` that joined this attempt wait
        /// for this condition.
        case settled = 2
    }

    /// What the attempt produced, as seen by the waiter that claims it.
    enum Outcome {
        /// Connected and handshaken, not yet marked: the claiming thread marks it.
        case connected(HandshakenSocket)
        case failed(ConnectError)
    }

    let id: UInt64
    let plan: HandshakePlan
    /// Real-time deadline of the background work (connect and handshake).
    let deadline: Instant
    let lock = NSConditionLock(condition: Condition.connecting.rawValue)
    private let cancelSignal: WakePipe
    private let cancelled = Atomic<Bool>(false)
    private let threadDone = Atomic<Bool>(false)
    /// Guarded by `lock` (see the class comment).
    private var outcome: Outcome?
    /// Guarded by `lock`: what joined callers get.
    private var settlement: Result<SessionInfo, ConnectError>?

    init(id: UInt64, plan: HandshakePlan, timeout: Duration) throws(ConnectError) {
        self.id = id
        self.plan = plan
        self.deadline = SystemClock().now() + timeout
        self.cancelSignal = try makeWakePipe()
    }

    /// Starts the background thread; it takes the lock before doing anything else.
    func start() {
        Thread.detachNewThread { [self] in
            BrokenPipeSignal.blockOnThisThread()
            lock.lock()
            var result: Outcome
            do throws(ConnectError) {
                result = .connected(try Handshaker(plan: plan, deadline: deadline, cancel: cancelSignal).run())
            } catch {
                result = .failed(error)
            }
            if cancelled.load(ordering: .acquiring), case .connected(let handshaken) = result {
                handshaken.stream.close()
                result = .failed(.cancelled)
            }
            outcome = result
            threadDone.store(true, ordering: .releasing)
            lock.unlock(withCondition: Condition.finished.rawValue)
        }
    }

    /// Blocks the calling thread until the attempt finished (true) or `deadline` passed
    /// (false). On true the caller holds the lock and must call `claim()`.
    func waitUntilFinished(before deadline: Date) -> Bool {
        lock.lock(whenCondition: Condition.finished.rawValue, before: deadline)
    }

    /// Takes the outcome and releases the lock (owner only).
    func claim() -> Outcome {
        defer { lock.unlock() }
        guard let result = outcome else { return .failed(.cancelled) }
        outcome = .failed(.cancelled)
        return result
    }

    /// Publishes the final result to joined callers (owner only, after `claim`).
    func settle(_ result: Result<SessionInfo, ConnectError>) {
        lock.lock()
        settlement = result
        lock.unlock(withCondition: Condition.settled.rawValue)
    }

    /// For a caller that joined an attempt someone else owns: waits until the owner
    /// settled it; nil when `deadline` passed first.
    func waitUntilSettled(before deadline: Date) -> Result<SessionInfo, ConnectError>? {
        guard lock.lock(whenCondition: Condition.settled.rawValue, before: deadline) else { return nil }
        defer { lock.unlock() }
        return settlement
    }

    /// Asks the background thread to stop; it wakes from any wait at once, closes its
    /// socket and finishes. Name resolution is the one step that cannot be interrupted:
    /// the thread notices the cancellation when it returns.
    func cancel() {
        cancelled.store(true, ordering: .releasing)
        cancelSignal.signal()
    }

    /// True once the background thread's work is over: it has closed or handed over its
    /// socket and is releasing the lock for the last time.
    var threadFinished: Bool { threadDone.load(ordering: .acquiring) }
}
