import SignalingSupport

/// What the store writer logs about failing commits, decided from the failures and
/// recoveries seen so far (the writer's thread only).
///
/// - Failures are counted from the last *successful* commit, not from the last retry
///   reset, and logged at error when the count is a power of two (1, 2, 4...): a store
///   that keeps failing logs a few lines with honest counts, not `attempt=1` each time.
/// - `store_recovered` is logged when a commit succeeds after failures.
/// - A store that fails again within `flapWindow` of a recovery is flapping (a full disk
///   takes small commits and refuses messages): that is logged at warn as
///   `store_flapping` with the number of such recoveries (at powers of two), and no more
///   `store_recovered`/`store_commit_failed` pairs, until it has stayed well for
///   `flapWindow`.
struct StoreHealthLog {
    static let flapWindow: Duration = .seconds(60)

    enum Report: Equatable {
        case failed(attempt: Int)
        case flapping(recoveries: Int)
        case recovered(afterFailures: Int)
    }

    private(set) var failuresSinceCommit = 0
    private var lastRecovery: Instant?
    private var recoveriesThatFailedAgain = 0

    /// A commit failed.
    mutating func failed(now: Instant) -> Report? {
        failuresSinceCommit += 1
        if failuresSinceCommit == 1 {
            if let lastRecovery, now - lastRecovery < Self.flapWindow {
                recoveriesThatFailedAgain += 1
                return isPowerOfTwo(recoveriesThatFailedAgain) ? .flapping(recoveries: recoveriesThatFailedAgain) : nil
            }
            recoveriesThatFailedAgain = 0
        }
        return isPowerOfTwo(failuresSinceCommit) ? .failed(attempt: failuresSinceCommit) : nil
    }

    /// A commit succeeded.
    mutating func committed(now: Instant) -> Report? {
        guard failuresSinceCommit > 0 else { return nil }
        let failures = failuresSinceCommit
        failuresSinceCommit = 0
        lastRecovery = now
        return recoveriesThatFailedAgain == 0 ? .recovered(afterFailures: failures) : nil
    }

    private func isPowerOfTwo(_ n: Int) -> Bool { n > 0 && n & (n - 1) == 0 }

    /// Writes `report` (nil: nothing).
    static func log(_ report: Report?, to logger: Logger, error: @autoclosure () -> String, changes: Int) {
        switch report {
        case nil: return
        case .failed(let attempt):
            logger.error("store_commit_failed", ["error": error(), "changes": changes, "attempt": attempt])
        case .flapping(let recoveries):
            logger.warning("store_flapping", [
                "error": error(), "recoveries": recoveries,
                "detail": "the store recovers and fails again by turns (a full disk takes small commits and refuses messages)",
            ])
        case .recovered(let failures):
            logger.info("store_recovered", ["after_failures": failures])
        }
    }
}
