import SignalingSupport

/// The active node's view of its store lease, on its own monotonic clock (docs/CLUSTER.md).
///
/// The store starts a lease's TTL when it executes the acquire or refresh, which is after
/// this node sent it: so `sent + ttl` is the earliest moment the lease can expire, as far as
/// this node can know, whatever the network and the store did meanwhile. The node must stop
/// acting as the owner before then: it steps down at `sent + ttl - margin`, the margin
/// covering a difference in clock rates and the time stepping down takes. Nothing in here
/// trusts a wall clock, and a stall of this process (a paused VM, a long page fault) only
/// moves `now` past `stepDownAt`, which then steps down at the first look.
///
/// Invariant: `nextRefresh <= stepDownAt`.
struct LeaseTerm: Equatable {
    let ttl: Duration
    /// The last acquire or refresh the store confirmed was sent at this instant.
    private(set) var confirmedSentAt: Instant
    /// Send the next refresh at (or after) this instant.
    private(set) var nextRefresh: Instant

    /// A refresh every third of the TTL: two can fail before the node must step down.
    var refreshInterval: Duration { ttl / 3 }
    /// After a failed refresh, the next one goes this much later: a few tries fit before
    /// the step-down, each bounded by the lease's I/O timeouts (`RedisLease`: a fifth of
    /// the TTL at most).
    var retryInterval: Duration { ttl / 10 }
    /// Stepping down begins this long before the lease could expire.
    var margin: Duration { ttl / 4 }
    var stepDownAt: Instant { confirmedSentAt + (ttl - margin) }

    init(ttl: Duration, acquiredSentAt: Instant) {
        self.ttl = ttl
        confirmedSentAt = acquiredSentAt
        nextRefresh = acquiredSentAt + ttl / 3
    }

    /// The store confirmed a refresh sent at `sentAt`.
    mutating func refreshed(sentAt: Instant) {
        confirmedSentAt = max(confirmedSentAt, sentAt)
        nextRefresh = confirmedSentAt + refreshInterval
    }

    /// A refresh could not be confirmed (the store unreachable or too slow): try again
    /// soon, never later than the step-down.
    mutating func refreshFailed(now: Instant) {
        nextRefresh = min(now + retryInterval, stepDownAt)
    }

    /// True once this node may no longer act as the owner.
    func mustStepDown(now: Instant) -> Bool { now >= stepDownAt }
}
