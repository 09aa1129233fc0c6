import SignalingSupport
import Synchronization

/// The store writer's commit under way, as loop 0's tick sees it: published by the writer
/// and declared stalled by loop 0, without a lock.
///
/// Two threads, each with its own part: the store writer (`begin`, `end`) is the only one
/// that starts or ends a commit; loop 0 (`running`, `declareStalled`) is the only one that
/// sets the stalled bit, and only on the commit it read. All of it is one state word
/// (`number << 2 | stalled << 1 | running`), so the two can never disagree about which
/// commit a stall belongs to:
///
/// - `declareStalled` is a compare-and-exchange from "commit N, running, not stalled": it
///   fails once the writer has ended commit N (or begun N + 1), so a stall declared late
///   can never outlive its commit and leave new messages refused with nothing running;
/// - `end` exchanges the word for "commit N, idle": whatever loop 0 declared before it is
///   in the value it takes, so a stall declared early is always reported as ended.
///
/// It replaced the `progress` lock (`store_progress`), held for a struct store by each
/// side but, on a busy host, sometimes for tens of µs by a holder that was preempted.
/// Cost: the writer does two relaxed stores and one releasing store per commit, and one
/// exchange; loop 0 three loads per tick, plus one compare-and-exchange when it declares.
final class CommitWatch: Sendable {
    private static let runningBit: UInt64 = 1
    private static let stalledBit: UInt64 = 2

    /// `number << 2 | stalled << 1 | running`: `number` counts commits begun (0: none yet).
    private let state = Atomic<UInt64>(0)
    /// When the commit under way began (`Instant.nanoseconds`), written before `state`.
    private let startedAt = Atomic<UInt64>(0)
    /// Its number of changes, written before `state`.
    private let changes = Atomic<Int>(0)

    /// The commit under way, as loop 0 read it.
    struct Commit: Equatable {
        /// Which commit (a commit seen at two ticks has the same number at both).
        let number: UInt64
        let started: Instant
        let changes: Int
        /// Loop 0 declared it stalled already.
        let stalled: Bool
    }

    // MARK: The writer

    /// The writer begins a commit of `changes` changes at `started`.
    func begin(at started: Instant, changes: Int) {
        let number = (state.load(ordering: .relaxed) >> 2) &+ 1
        startedAt.store(started.nanoseconds, ordering: .relaxed)
        self.changes.store(changes, ordering: .relaxed)
        // Releasing: a reader that sees the new number sees its start and size too.
        state.store(number << 2 | Self.runningBit, ordering: .releasing)
    }

    /// The writer's commit returned (committed or failed). Returns when it began if loop 0
    /// had declared it stalled (the caller reports the stall as ended), else nil.
    func end() -> Instant? {
        let number = state.load(ordering: .relaxed) >> 2
        let previous = state.exchange(number << 2, ordering: .acquiringAndReleasing)
        guard previous & Self.stalledBit != 0 else { return nil }
        return Instant(nanoseconds: startedAt.load(ordering: .relaxed))
    }

    // MARK: Loop 0

    /// The commit under way, or nil while the writer is between commits. The start read
    /// after the number may belong to a commit begun since (never an older one): a commit
    /// then looks younger than it is, and is declared at a later tick, never too early.
    var running: Commit? {
        let word = state.load(ordering: .acquiring)
        guard word & Self.runningBit != 0 else { return nil }
        return Commit(
            number: word >> 2, started: Instant(nanoseconds: startedAt.load(ordering: .relaxed)),
            changes: changes.load(ordering: .relaxed), stalled: word & Self.stalledBit != 0)
    }

    /// Loop 0 declares commit `number` stalled. False when it is no longer the one under
    /// way (it returned meanwhile) or was declared already.
    func declareStalled(_ number: UInt64) -> Bool {
        state.compareExchange(
            expected: number << 2 | Self.runningBit, desired: number << 2 | Self.stalledBit | Self.runningBit,
            ordering: .acquiringAndReleasing
        ).exchanged
    }

    /// A commit is running and was declared stalled: new messages and calls are refused.
    var isStalled: Bool { state.load(ordering: .relaxed) & Self.stalledBit != 0 }
}
