import Foundation

/// A hold of a routing shard that a thread other than its running owner hands to the owner
/// (`LoopTask.shardWork`, `Switchboard.exclusive`) and waits for: the owner runs it on
/// its thread, with no lock, and wakes the waiter. The waiter is never a loop (a loop
/// waits for no one), so the owner never waits for it.
///
/// An inbox that took the task runs it: `EventLoop.runInbox` while the loop runs, else
/// `closeInbox` as the loop stops (under the fallback lock then: the owner let go of the
/// shard first). So `wait` returns once the post was taken.
final class ShardWork: @unchecked Sendable {
    private let condition = NSCondition()
    /// What to run (guarded by `condition`); nil once run. Dropped before the waiter is
    /// woken: it is the waiter's non-escaping closure (`withoutActuallyEscaping`), which
    /// must not outlive the wait.
    private var work: (() -> Void)?
    private var done = false

    init(_ work: @escaping () -> Void) {
        self.work = work
    }

    /// Runs the work (the owner's thread), then wakes the waiter.
    func run() {
        if let work = take() { work() }
        condition.lock()
        done = true
        condition.signal()
        condition.unlock()
    }

    private func take() -> (() -> Void)? {
        condition.lock()
        defer { condition.unlock() }
        let taken = work
        work = nil
        return taken
    }

    /// Blocks the calling thread (never a loop) until the owner has run the work.
    func wait() {
        condition.lock()
        while !done { condition.wait() }
        condition.unlock()
    }
}
