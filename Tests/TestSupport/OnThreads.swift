import SignalingSupport
import Synchronization

/// Runs `body(thread)` on `count` threads at once and waits for all of them: every thread
/// spins until all have started, so that they really contend (the lock-free structures'
/// tests: each result is checked against what a lock would guarantee).
public func onThreads(_ count: Int, _ body: @escaping @Sendable (Int) -> Void) {
    let started = Atomic<Int>(0)
    let threads = (0..<count).map { thread in
        JoinableThread {
            started.add(1, ordering: .relaxed)
            while started.load(ordering: .relaxed) < count {}
            body(thread)
        }
    }
    for thread in threads { thread.join() }
}
