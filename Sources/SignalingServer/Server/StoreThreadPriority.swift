import SignalingSupport

/// `--store-thread-priority`: whether the store's threads give way to the event loops.
public enum StoreThreadPriorityMode: String, Sendable, CaseIterable {
    /// With a store, its writer and its own threads (the WAL checkpointer) run at the idle
    /// scheduling policy while they keep up and are raised in two steps (nice 19, then their
    /// own nice value) while they fall behind (`StoreThreadPriority`), when the process may raise them back (CAP_SYS_NICE or an
    /// RLIMIT_NICE of at least 20, checked at start); otherwise as with `normal`.
    case auto
    /// The normal policy, like every other thread.
    case normal
}

/// The store's threads at the idle policy while they keep up, raised while they fall
/// behind: first to the normal policy at nice 19, then, if that is not enough, to the
/// normal policy at their own nice value. Loop 0 decides (`observe`), the one owner.
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
/// waiting for its commit, the commit under way, arrivals no pass has taken).
///
/// Why two steps: raised straight to the normal policy at nice 0, a writer runs each group
/// commit (200-400 µs) to the end of its slice while a woken loop waits: in the closed loop
/// of the benchmark one message in about thirteen waited that long for the second the
/// threads stayed raised (`perf sched timehist`, docs/LOAD-TESTING.md). At nice 19 the
/// writer is sure of some CPU (about 1.5 % of a CPU against each busy thread, all it wants
/// when the CPUs have any slack) and still weighs so little that a woken loop gets the CPU
/// within tens of µs. Only a writer that stays behind at nice 19 for `farBehindAfter`
/// competes as an equal.
///
/// But a writer that has not run at all for `starvedAfter` (arrivals no pass has taken) is
/// starved, not slow: the CPUs are saturated, and its queue grows by everything the loops
/// accept, each unit resident until committed. It goes straight to the normal policy, as
/// with one step: at nice 19 it stayed starved up to `farBehindAfter`, and a 15,000-device
/// ramp of handshakes left 540-650 B per idle device resident afterwards, against 490. In
/// the benchmark's closed loop most raises are of this kind too, so there the two steps
/// help little; they serve a writer that runs but is slow. `starvedAfter` is 20 ms (at
/// least twice `--commit-interval`, which the writer spends gathering on purpose): at 50
/// ms, as `behindAfter`, the ramp's backlog left 483-583 B per idle device resident
/// after it; at 20 ms, 481-489 (alternated, four runs each).
///
/// Raising a thread from `SCHED_IDLE`, or lowering its nice value, needs CAP_SYS_NICE or an
/// RLIMIT_NICE of at least 20 (root has both; systemd: `LimitNICE=20`), so `auto` lowers the
/// threads only when the process may raise them again.
///
/// A transition returns what to do, the caller does it (`StoreWriter.superviseCommits`).
struct StoreThreadPriority: Equatable, Sendable {
    /// Where the threads stand, from the lightest to the heaviest.
    enum Level: Int, Comparable, Sendable {
        /// `SCHED_IDLE`: while the writer keeps up.
        case idle
        /// The normal policy at nice 19: behind for `behindAfter`.
        case nice19
        /// The normal policy at the threads' own nice value: behind for `farBehindAfter`.
        case normal

        static func < (a: Level, b: Level) -> Bool { a.rawValue < b.rawValue }

        /// What a thread that started at nice value `own` runs at on this level. A thread
        /// already lighter than nice 19 (the whole server run at nice 19) keeps its own.
        func scheduling(own: Int32) -> SchedulingPriority {
            switch self {
            case .idle: .idle
            case .nice19: .normal(nice: max(own, 19))
            case .normal: .normal(nice: own)
            }
        }
    }

    /// What to do with the threads: move them to this level (`raise`, `stepDown`, `lower`).
    enum Action: Equatable, Sendable {
        /// Move the threads up to this level: the writer fell behind.
        case raise(to: Level)
        /// Move them from their own nice value down to nice 19: the writer caught up.
        case stepDown
        /// Move them back to the idle policy: it has kept up for `lowerAfter`.
        case lower
    }

    /// Work waiting this long means the writer is behind. A commit normally takes a few ms
    /// (a gathering of `--commit-interval`, the write, an fsync); a slow disk that makes it
    /// longer only raises the threads, which costs nothing but the tail this is for.
    static let behindAfter: Duration = .milliseconds(50)
    /// Work waiting this long means nice 19 is not enough either: the CPUs are saturated
    /// and the writer must compete as an equal (a tick of 250 ms after the first raise at
    /// most, by default).
    static let farBehindAfter: Duration = .milliseconds(250)
    /// How long the writer must keep up before its threads go back to idle: transitions
    /// at most about once a second however the load swings.
    static let lowerAfter: Duration = .seconds(1)
    /// Arrivals no pass has taken for this long mean the writer is starved (above).
    let starvedAfter: Duration

    /// - Parameter commitInterval: how long the writer gathers before it commits
    ///   (`--commit-interval`): arrivals wait that long on purpose, so a writer is starved
    ///   only after twice that, and never before 20 ms.
    init(commitInterval: Duration = .milliseconds(2)) {
        starvedAfter = max(.milliseconds(20), commitInterval * 2)
    }

    /// Where the threads are now.
    private(set) var level = Level.idle
    /// Since when every observation has found the writer keeping up (while raised).
    private var keptUpSince: Instant?

    /// The threads run above the idle policy now.
    var raised: Bool { level != .idle }

    /// Loop 0's tick or callback: how long the writer has kept work waiting, at `now`, of
    /// that how long arrivals have waited with no pass of the writer taking any (`unrun`),
    /// and whether devices completed handshakes since loop 0's previous tick (`settingUp`).
    mutating func observe(now: Instant, waited: Duration, unrun: Duration = .zero, settingUp: Bool = false) -> Action? {
        if waited >= Self.behindAfter || unrun >= starvedAfter {
            keptUpSince = nil
            // Not run at all: starved, not slow (see above).
            let starved = unrun >= starvedAfter
            let wanted: Level = waited >= Self.farBehindAfter || starved ? .normal : .nice19
            guard wanted > level else { return nil }
            level = wanted
            return .raise(to: wanted)
        }
        guard raised else { return nil }
        // Caught up at its own nice value, and no connections are being set up: down to
        // nice 19 at once, where a loop that wakes gets the CPU within tens of µs, instead
        // of competing as an equal for the whole second of keeping up. In the benchmark's
        // closed loop (both CPUs busy) the writer is starved at idle every few seconds and
        // raised straight to its own nice value; kept there, it ran before 193 and 310 of
        // loop 0's waits over 50 µs while raised, and 34 and 12 with the step down
        // (`Tools/bench-sched-delays`, alternated). Not during a ramp of handshakes: at
        // nice 19 the writer then lags by up to `farBehindAfter`, its waiting units
        // interleaved with the connections' long-lived allocations, and they stayed
        // resident after the ramp (506-537 B per idle device against 475-499). Starved
        // again at nice 19, it goes back up at `starvedAfter`.
        if level == .normal && !settingUp {
            level = .nice19
            keptUpSince = now
            return .stepDown
        }
        guard let since = keptUpSince else {
            keptUpSince = now
            return nil
        }
        guard now - since >= Self.lowerAfter else { return nil }
        level = .idle
        keptUpSince = nil
        return .lower
    }
}
