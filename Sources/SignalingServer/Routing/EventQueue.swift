/// A device's unacknowledged events, in sequence order.
///
/// Sequence numbers are contiguous: the queue holds exactly the events numbered
/// `firstSeq ..< firstSeq + count`, so finding "everything after n" is arithmetic. An empty
/// queue holds no allocation, which matters with a million idle devices.
struct EventQueue {
    private var storage: [QueuedEvent] = []
    /// The sequence number of the oldest queued event (when the queue is not empty); in
    /// any case everything before it is acknowledged.
    private(set) var firstSeq: UInt64
    private var head: UInt32 = 0

    init(nextSeq: UInt64) {
        firstSeq = nextSeq
    }

    var count: Int { storage.count - Int(head) }
    var isEmpty: Bool { count == 0 }
    /// The highest sequence number ever assigned in this queue.
    var lastSeq: UInt64 { firstSeq &+ UInt64(count) &- 1 }
    /// Everything ≤ this is acknowledged.
    var ackedSeq: UInt64 { firstSeq - 1 }

    /// Appends `event` and returns its sequence number.
    mutating func append(_ event: QueuedEvent) -> UInt64 {
        storage.append(event)
        return lastSeq
    }

    /// Makes an empty queue continue after `seq` (numbers a restarted server must not hand
    /// out again, with no events behind them).
    mutating func skip(through seq: UInt64) {
        precondition(isEmpty, "skipping numbers of a queue that holds events")
        firstSeq = max(firstSeq, seq &+ 1)
    }

    /// Drops every event numbered ≤ `seq`, handing each to `body` first.
    mutating func removeThrough(_ seq: UInt64, _ body: (UInt64, QueuedEvent) -> Void) {
        while Int(head) < storage.count && firstSeq <= seq {
            body(firstSeq, storage[Int(head)])
            head += 1
            firstSeq += 1
        }
        if Int(head) == storage.count {
            storage = []  // release the buffer entirely: idle devices hold no memory
            head = 0
            if firstSeq <= seq { firstSeq = seq + 1 }  // acknowledging a gap left by a restart
        } else if head >= 64 && Int(head) * 2 >= storage.count {
            storage.removeFirst(Int(head))
            head = 0
        }
    }

    /// The event numbered `seq`, or nil when it is not queued (acknowledged, or not yet
    /// assigned).
    func event(_ seq: UInt64) -> QueuedEvent? {
        guard seq >= firstSeq && seq <= lastSeq else { return nil }
        return storage[Int(head) + Int(seq - firstSeq)]
    }
}
