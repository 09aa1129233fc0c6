/// When, with a durable store, a new event may be written to a device that is connected.
///
/// Either way the sender's OK waits for the commit, so nothing acknowledged is ever lost,
/// and devices with no connection are woken only for committed events.
public enum Delivery: String, Sendable, CaseIterable {
    /// At once, while its commit is still under way: push latency does not include a
    /// commit or the hand-off to the store-writer thread, and an event acknowledged before
    /// its commit is never written to disk at all. The price is paid only on a crash of
    /// the server between delivery and commit: the device saw events the restarted server
    /// does not have (its resume point then skips them, PROTOCOL §5), and a sender that
    /// never got its OK sends the message again, which the recipient's client library drops
    /// by message id.
    case immediate
    /// Only after the commit: a device never sees an event the store does not hold.
    /// Every push waits for a commit.
    case afterCommit = "after-commit"
}
