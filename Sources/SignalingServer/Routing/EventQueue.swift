/// A device's unacknowledged events, in sequence order.
///
/// Numbers only grow, but not every number has an event behind it: a restarted server
/// continues after the numbers it had reserved for the device (up to 65,536 of them), and
/// a stored queue may have holes. So each entry carries its own number and a hole costs
/// nothing: `count` is the number of real events, which is what `--max-pending` limits
/// and what logs and wake-ups report. (Numbers used to be implied by position, and a
/// restart filled every reserved number with a placeholder that counted as pending: a
/// device could come back "full" and refuse every message for good.)
///
/// Cost: 16 bytes per queued event; finding "the events after n" is a binary search; an
/// empty queue holds no allocation, which matters with a million idle devices.
///
/// Numbers without an event count as acknowledged: `ackedSeq` is the number before the
/// oldest queued event (or `lastSeq` when nothing is queued).
struct EventQueue {
    /// The entries before `head` are removed ones, their events released (nil) by the call
    /// that removed them: a removal's cost stays with it, where keeping the references
    /// until the buffer is compacted released up to half the queue (thousands of events,
    /// about 0.15 µs each) in whichever hold compacted it.
    private var entries: [(seq: UInt64, event: QueuedEvent?)] = []
    private var head: UInt32 = 0
    /// The highest sequence number ever assigned (or skipped) in this queue.
    private(set) var lastSeq: UInt64

    /// A queue whose first event will be numbered `nextSeq`.
    init(nextSeq: UInt64) {
        lastSeq = nextSeq &- 1
    }

    var count: Int { entries.count - Int(head) }
    var isEmpty: Bool { count == 0 }
    /// Everything ≤ this is acknowledged (or has no event).
    var ackedSeq: UInt64 { isEmpty ? lastSeq : entries[Int(head)].seq - 1 }

    /// Appends `event` under the next number and returns that number.
    mutating func append(_ event: QueuedEvent) -> UInt64 {
        lastSeq += 1
        entries.append((lastSeq, event))
        return lastSeq
    }

    /// Appends `event` under `seq`, which must be above `lastSeq` (the numbers between
    /// stay holes). For rebuilding a stored queue.
    mutating func append(_ event: QueuedEvent, as seq: UInt64) {
        precondition(seq > lastSeq, "sequence numbers only grow")
        lastSeq = seq
        entries.append((seq, event))
    }

    /// Makes the queue continue after `seq`: numbers a restarted server must not hand out
    /// again, with no events behind them.
    mutating func skip(through seq: UInt64) {
        lastSeq = max(lastSeq, seq)
    }

    /// Drops the events numbered ≤ `seq`, the oldest first, at most `limit` of them,
    /// handing each to `body` first. Cost: the events dropped (and now and then a move of
    /// what is left to the front of the buffer, amortised over the events dropped).
    mutating func removeThrough(_ seq: UInt64, limit: Int = .max, _ body: (UInt64, QueuedEvent) -> Void) {
        var removed = 0
        while removed < limit && Int(head) < entries.count && entries[Int(head)].seq <= seq {
            let entry = entries[Int(head)]
            entries[Int(head)].event = nil
            body(entry.seq, entry.event!)
            head += 1
            removed += 1
        }
        if Int(head) == entries.count {
            entries = []  // release the buffer entirely: idle devices hold no memory
            head = 0
        } else if head >= 64 && Int(head) * 2 >= entries.count {
            entries.removeFirst(Int(head))
            head = 0
        }
    }

    /// Takes the event numbered `seq` out of the queue (its number becomes a hole) and
    /// returns it; nil if none is queued under it. Searches from the newest event: for
    /// withdrawing one appended moments ago (cost: the events after it).
    mutating func remove(_ seq: UInt64) -> QueuedEvent? {
        guard let index = entries[Int(head)...].lastIndex(where: { $0.seq <= seq }), entries[index].seq == seq else {
            return nil
        }
        let event = entries.remove(at: index).event!
        if Int(head) == entries.count {
            entries = []
            head = 0
        }
        return event
    }

    /// Hands `body` the queued events numbered after `seq`, in order, while it returns
    /// true.
    func forEach(after seq: UInt64, _ body: (UInt64, QueuedEvent) -> Bool) {
        // Binary search for the first entry after `seq`.
        var low = Int(head), high = entries.count
        while low < high {
            let middle = (low + high) / 2
            if entries[middle].seq <= seq { low = middle + 1 } else { high = middle }
        }
        for index in low..<entries.count {
            guard body(entries[index].seq, entries[index].event!) else { return }
        }
    }

    /// The event numbered `seq`, or nil when none is queued under it (acknowledged, a
    /// hole, or not yet assigned).
    func event(_ seq: UInt64) -> QueuedEvent? {
        var found: QueuedEvent?
        forEach(after: seq &- 1) { number, event in
            if number == seq { found = event }
            return false
        }
        return found
    }
}
