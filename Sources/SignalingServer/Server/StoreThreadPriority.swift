import SignalingSupport

/// `--store-thread-priority`: whether the store's threads give way to the event loops.
public enum StoreThreadPriorityMode: String, Sendable, CaseIterable {
    /// With a store, its writer and its own threads (the WAL checkpointer) run at the idle
    /// scheduling policy while they keep up and at the normal one while they fall behind
    /// (`StoreThreadPriority`), when the process may raise them back (CAP_SYS_NICE or an
    /// RLIMIT_NICE of at least 20, checked at start); otherwise as with `normal`.
    case auto
    /// The normal policy, like every other thread.
    case normal
}

/// The store's threads at the idle policy while they keep up, raised to the normal one
/// while they fall behind: loop 0 decides at each tick (`observe`), the one owner.
///
/// Why: with a durable store every message costs the store writer tens of µs of CPU (its
/// share of a group commit) on the cores the loops use. At the normal policy a writer
/// that woke to commit keeps its CPU for its slice, and a loop woken by a request
/// meanwhile waits for it, or for the CPU the clients on the host use: in the closed loop
/// of `Tools/bench-reference` that was most of the default configuration's push p99
/// (docs/LOAD-TESTING.md, "The store's threads at idle priority"). At `SCHED_IDLE` the
/// kernel counts a CPU that runs only the writer as idle: a waking loop is placed there
/// and preempts the writer at once.
///
/// The risk it guards against: a thread at `SCHED_IDLE` gets almost no CPU while threads
/// of the normal policy want all of it (a saturated server, a busy neighbour), and the
/// writer with it; measured, a commit stuck for 1.1 s while builds used both CPUs of this
/// host, and with it the OKs, and the events beyond each device's reserved numbers. So
/// loop 0 watches how long the writer has kept work waiting (`waited`: the oldest message
/// waiting for its commit, the commit under way, arrivals no pass has taken): from
/// `behindAfter` the threads run at the normal policy, as without this, until the writer
/// has kept up for `lowerAfter`. Raising a thread from `SCHED_IDLE` needs CAP_SYS_NICE or an
/// RLIMIT_NICE of at least 20 (root has both; systemd: `LimitNICE=20`), so `auto` lowers
/// the threads only when the process may raise them again.
///
/// A transition returns what to do, the caller does it (`StoreWriter.superviseCommits`).
struct StoreThreadPriority: Equatable, Sendable {
    enum Action: Equatable, Sendable {
        /// Move the threads to the normal policy: the writer fell behind.
        case raise
        /// Move them back to the idle policy: it has kept up for `lowerAfter`.
        case lower
    }

    /// Work waiting this long means the writer is behind. A commit normally takes a few ms
    /// (a gathering of `--commit-interval`, the write, an fsync); a slow disk that makes it
    /// longer only raises the threads, which costs nothing but the tail this is for.
    static let behindAfter: Duration = .milliseconds(50)
    /// How long the writer must keep up before its threads go back to idle: transitions
    /// at most about once a second however the load swings.
    static let lowerAfter: Duration = .seconds(1)

    /// The threads run at the normal policy now.
    private(set) var raised = false
    /// Since when every observation has found the writer keeping up (while raised).
    private var keptUpSince: Instant?

    /// Loop 0's tick: how long the writer has kept work waiting, at `now`.
    mutating func observe(now: Instant, waited: Duration) -> Action? {
        if waited >= Self.behindAfter {
            keptUpSince = nil
            guard !raised else { return nil }
            raised = true
            return .raise
        }
        guard raised else { return nil }
        guard let since = keptUpSince else {
            keptUpSince = now
            return nil
        }
        guard now - since >= Self.lowerAfter else { return nil }
        raised = false
        keptUpSince = nil
        return .lower
    }
}
