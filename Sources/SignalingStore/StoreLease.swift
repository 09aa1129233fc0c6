/// Exclusive ownership of a shared store for a limited time (docs/CLUSTER.md): the node
/// that holds it is the only one that serves devices and writes; the others wait as
/// standbys. The store behind it refuses the batches of a node that does not hold it
/// (fencing), so a node whose lease lapsed while it was stalled cannot write late.
///
/// Calls are made by one thread at a time (the node's lease thread); each returns within
/// the lease's I/O timeout, which is short against `ttl`, so that the caller can always
/// step down before its lease could have expired.
public protocol StoreLease: AnyObject, Sendable {
    /// How long the lease lasts after each acquire or refresh, as Redis counts it.
    var ttl: Duration { get }
    /// What the lease holds while this node has it: new at every take (so each active
    /// term fences with a token of its own, and a late batch of an earlier term of the
    /// same process is refused too), with the host name and pid for people.
    var ownerID: String { get }
    /// Takes the lease if nobody holds it, under a new `ownerID`. False: another node
    /// holds it. Throws when the store cannot be reached.
    func acquire() throws(StoreError) -> Bool
    /// Extends the lease by `ttl` if this node still holds it. False: it does not (it
    /// expired, another node took it, or the store lost it).
    func refresh() throws(StoreError) -> Bool
    /// Gives the lease up if this node holds it, so a standby can take over at once.
    /// Best effort: a failure leaves the lease to expire.
    func release()
    /// Who holds the lease now (nil: nobody, or the store cannot be reached), for logs and /readyz.
    func holder() -> String?
}
