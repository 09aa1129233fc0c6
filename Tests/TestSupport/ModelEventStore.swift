import SQLiteStoreFixtures
import SignalingProtocol
import SignalingStore
import SignalingSupport
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// An `EventStore` kept in memory, for server tests: the reference model of the store's
/// semantics (`ReferenceStore`, which the SQLite store is also checked against), plus
/// what a test needs: it survives "restarts" of a server in the same process, counts
/// commits, and can be told to fail like a full disk or to hang like a frozen file system.
public final class ModelEventStore: EventStore {
    private struct State {
        var model = ReferenceStore()
        var failure: StoreError?
        var batches = 0
        var failedAttempts = 0
        var applied: [StoreChange] = []
        var applyDelay: Duration = .zero
        var lastAttempt: [StoreChange] = []
        var gateClosed = false
        var waitingAtGate = 0
    }
    private let state = Mutex(State())

    public init() {}

    /// While set, every `apply` fails with this error and changes nothing.
    public func failCommits(with error: StoreError?) {
        state.withLock { $0.failure = error }
    }

    /// Every `apply` takes at least this long (a slow disk).
    public func delayCommits(by delay: Duration) {
        state.withLock { $0.applyDelay = delay }
    }

    /// While the gate is closed, every `apply` blocks (a write that never returns, as on a
    /// frozen file system) until it opens; then it commits (or fails, if told to).
    public func closeGate() {
        state.withLock { $0.gateClosed = true }
    }

    public func openGate() {
        state.withLock { $0.gateClosed = false }
    }

    /// How many `apply` calls are blocked at the closed gate now.
    public var appliesWaitingAtGate: Int { state.withLock { $0.waitingAtGate } }

    public var committedBatches: Int { state.withLock { $0.batches } }
    public var failedAttempts: Int { state.withLock { $0.failedAttempts } }
    /// Every change of every committed batch, in order.
    public var appliedChanges: [StoreChange] { state.withLock { $0.applied } }
    /// The changes of the last `apply`, committed or failed.
    public var lastAttempt: [StoreChange] { state.withLock { $0.lastAttempt } }

    public func loadSnapshot() throws(StoreError) -> StoredSnapshot {
        state.withLock { $0.model.snapshot }
    }

    /// Every event currently stored for a device.
    public func events(user: String, device: String) -> [StoredEvent] {
        state.withLock { state in
            state.model.snapshot.devices.first { $0.userID == user && $0.deviceID == device }?.events ?? []
        }
    }

    public func apply(_ changes: [StoreChange]) throws(StoreError) {
        let blocked = state.withLock { state in
            state.lastAttempt = changes
            if state.gateClosed { state.waitingAtGate += 1 }
            return state.gateClosed
        }
        if blocked {
            // A condition, not a guess: the test opens the gate when it has seen what it
            // needs. Polled, since apply runs on the server's writer thread.
            while state.withLock({ $0.gateClosed }) { usleep(500) }
            state.withLock { $0.waitingAtGate -= 1 }
        }
        let delay = state.withLock { $0.applyDelay }
        if delay > .zero {
            let deadline = SystemClock().now() + delay
            while SystemClock().now() < deadline { usleep(1_000) }
        }
        let failure: StoreError? = state.withLock { state in
            state.lastAttempt = changes
            if let failure = state.failure {
                state.failedAttempts += 1
                return failure
            }
            state.model.apply(changes)
            state.applied += changes
            state.batches += 1
            return nil
        }
        if let failure { throw failure }
    }

    public func close() {}
}

extension ModelEventStore: EventBodySource {
    public func bodies(user: String, device: String, from seq: UInt64, limit: Int) throws(StoreError) -> [(seq: UInt64, body: [UInt8])] {
        events(user: user, device: device).filter { $0.seq >= seq }.prefix(limit).map { ($0.seq, $0.body) }
    }
}
