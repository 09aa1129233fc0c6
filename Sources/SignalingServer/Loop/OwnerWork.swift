import Foundation

/// Work that a thread other than a running loop's own hands to that loop (`LoopTask.ownerWork`)
/// and waits for: a hold of the loop's routing shard (`Switchboard.exclusiveElsewhere`), or a
/// callback on its state (`EventLoop.owned` from another thread). The loop runs it on its
/// thread, with no lock, and wakes the waiter. The waiter is never a loop (a loop waits
/// for no one), so the loop never waits for it.
///
/// An inbox that took the task runs it: `EventLoop.runInbox` while the loop runs, else
/// `closeInbox` as the loop stops (under the fallback locks then: the loop let go of its
/// state and its shard first). So `wait` returns once the post was taken.
final class OwnerWork: @unchecked Sendable {
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

    /// Hands `work` to `loop`, which runs it on its own thread, and waits until it has run.
    /// False: the loop's inbox refused it (it has just let go of its state and its shard),
    /// and nothing ran. The one hand-off of a shard's holds and of a loop's callbacks.
    static func run(on loop: EventLoop, _ work: () -> Void) -> Bool {
        withoutActuallyEscaping(work) { work in
            let handOff = OwnerWork(work)
            guard loop.post(.ownerWork(handOff, loop: loop.index)) else { return false }
            handOff.wait()
            return true
        }
    }
}
