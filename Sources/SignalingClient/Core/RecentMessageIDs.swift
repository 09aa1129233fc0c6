/// The ids of the last messages handed to the app, so that a message that arrives a second
/// time under a new sequence number is dropped.
///
/// Sequence numbers make delivery exactly-once while the server keeps its state
/// (`EventSequencer`). One case is beyond them: a server that writes events before their
/// commit (`--delivery immediate`, its default) crashes after delivering a message but
/// before telling the sender it was accepted; the sender sends it again and the restarted
/// server, which never stored it, delivers it anew. Only messages in flight at the crash
/// are at stake, so a bounded window of recent ids is enough. Owned by the client's queue.
struct RecentMessageIDs {
    private struct Key: Hashable {
        var sender: String
        var messageID: String
    }

    let capacity: Int
    private var ring: [Key?]
    private var next = 0
    private var members: Set<Key> = []

    init(capacity: Int = 4096) {
        precondition(capacity > 0)
        self.capacity = capacity
        ring = Array(repeating: nil, count: capacity)
    }

    /// Records the message; false when it is among the last `capacity` ones already.
    mutating func insert(sender: String, messageID: String) -> Bool {
        let key = Key(sender: sender, messageID: messageID)
        guard members.insert(key).inserted else { return false }
        if let evicted = ring[next] { members.remove(evicted) }
        ring[next] = key
        next = (next + 1) % capacity
        return true
    }
}
