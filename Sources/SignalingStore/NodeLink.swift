/// The channel between the nodes of a cluster that share one store (docs/CLUSTER.md,
/// "Every node serves devices"): each node listens on a channel named by its id, and any
/// node can send a packet to any other node's channel. On Redis it is pub/sub
/// (`RedisNodeLink`); the tests also run it in memory.
///
/// Delivery is at most once, and **in order per sender and destination**: packets one node
/// sends to another arrive in the order `send` was called, whichever of its threads called
/// it, as long as the link stays up. A link that goes down may have lost packets in either
/// direction; it says so (`NodeLinkEvent.down`), and whoever relied on the packets starts
/// over (a relaying node closes what it relayed, a routing node forgets it).
///
/// Presence: while it is up, the link keeps this node's presence key alive (refreshed in
/// one command per interval, not per device) and, asked with `checkPresence`, says which of
/// the given nodes no longer have theirs (`NodeLinkEvent.gone`): a node killed with -9, or
/// cut off from the store, stops refreshing and is gone after the presence TTL.
public protocol NodeLink: AnyObject, Sendable {
    /// This node's id, the name of its channel: unique per process and never reused.
    var nodeID: String { get }
    /// Starts the link (connects, subscribes to `nodeID`'s channel, keeps the presence key)
    /// and reconnects with back-off whenever it drops. `handler` is called on the link's
    /// own thread, one event at a time, in order; it must not block (post to a loop).
    func start(_ handler: @escaping @Sendable (NodeLinkEvent) -> Void)
    /// Also listens on the channel `name` (a routing node's lease owner id, which devices'
    /// relays address), until `stopListening(as:)`. It takes effect a moment later (on Redis,
    /// once the store has run the subscription): a packet sent to `name` before that comes
    /// back undeliverable. A sender that must not lose its first packets asks first
    /// (`checkListener`).
    func listen(as name: String)
    func stopListening(as name: String)
    /// Queues `packet` for the channel of `node`. Returns at once; any thread. A packet for
    /// a node that nobody listens as comes back as `NodeLinkEvent.undeliverable`.
    func send(_ packet: [UInt8], to node: String)
    /// Asks whether anyone listens as `name` now: if so, the answer comes back as
    /// `NodeLinkEvent.listening(name)`, and every packet sent after that answer reaches
    /// that listener unless it stops listening; if not, nothing comes back (ask again
    /// later). Asked while the link is down, it is not answered. Returns at once; any thread.
    func checkListener(_ name: String)
    /// Asks which of `nodes` have no presence key any more: each comes back as
    /// `NodeLinkEvent.gone`. Returns at once; any thread.
    func checkPresence(of nodes: [String])
    /// Stops the link and waits for its thread; no event is delivered afterwards.
    func stop()
}

/// What a `NodeLink` tells its node, on the link's thread, in order.
public enum NodeLinkEvent: Sendable, Equatable {
    /// A packet sent to this node's channel (or a name it listens as).
    case packet([UInt8])
    /// The link is connected and subscribed: packets sent to this node arrive from now on.
    case up
    /// The link dropped (the store restarted, a partition, a slow subscriber cut off by the
    /// store): packets sent either way since the last `up` may be lost. It reconnects with
    /// back-off and says `up` again.
    case down(reason: String)
    /// A packet sent to `node` reached no listener: that node is gone, or no longer listens
    /// under that name (a routing node that stepped down).
    case undeliverable(node: String)
    /// `node`'s presence key has expired (`checkPresence`).
    case gone(node: String)
    /// Somebody listens as `node` (`checkListener`): packets sent to it from now on reach it.
    case listening(node: String)
}
