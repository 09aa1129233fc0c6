import Foundation

/// The single outcome of a command: set once (the first `finish` wins), waited for by
/// the main thread. Thread-safe.
final class OutcomeLatch: @unchecked Sendable {
    private let condition = NSCondition()
    private var outcome: Outcome?  // guarded by `condition`

    /// Records the outcome unless one was recorded; true when this call recorded it.
    @discardableResult
    func finish(_ outcome: Outcome) -> Bool {
        condition.lock()
        defer { condition.unlock() }
        guard self.outcome == nil else { return false }
        self.outcome = outcome
        condition.broadcast()
        return true
    }

    var isFinished: Bool {
        condition.lock()
        defer { condition.unlock() }
        return outcome != nil
    }

    func wait() -> Outcome {
        condition.lock()
        defer { condition.unlock() }
        while outcome == nil { condition.wait() }
        return outcome!
    }
}
