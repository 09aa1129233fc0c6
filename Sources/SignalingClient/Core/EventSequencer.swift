import SignalingProtocol

/// Exactly-once delivery of server events to the app, and the ACK bookkeeping.
///
/// Sequence numbers are per device and keep growing across connections and sessions
/// (PROTOCOL §5), so one floor is enough: an event at or below `lastDelivered` was
/// already handed to the app and is dropped. An event counts as processed once the
/// app's handler has returned; ACKs and the resume point use `lastProcessed`, so an event
/// the app never finished handling is sent again (and dropped as a duplicate only if it
/// had been handed over). Owned by the client's queue.
struct EventSequencer {
    /// Highest sequence number handed to the app.
    private(set) var lastDelivered: UInt64 = 0
    /// Highest sequence number whose handler returned.
    private(set) var lastProcessed: UInt64 = 0
    /// What the server holds as acknowledged on the current connection.
    private(set) var acknowledgedOnConnection: UInt64 = 0
    /// Highest sequence number received on the current connection (or covered by its
    /// resume point): an ACK beyond it would be a protocol error.
    private(set) var highestReceivedOnConnection: UInt64 = 0

    /// Bumped when the server's numbering starts over (see `connectionStarted`), so that
    /// "processed" reports for events of the old numbering are ignored.
    private(set) var epoch = 0

    /// A connection was established. A resume point counts as an acknowledgement.
    ///
    /// A WELCOME whose `lastSeq` (the highest number the server ever assigned to this
    /// device) is below what this client already delivered means the server lost its
    /// state (a restart with an in-memory store, or the device was forgotten): its
    /// numbering starts again, and keeping the old floor would drop every new event as a
    /// "duplicate". The floor is reset.
    mutating func connectionStarted(welcome: Welcome, resumedFrom: UInt64?) {
        if !welcome.resumed && welcome.lastSeq < lastDelivered {
            lastDelivered = 0
            lastProcessed = 0
            epoch += 1
        }
        let acknowledged = max(welcome.ackedSeq, welcome.resumed ? (resumedFrom ?? 0) : 0)
        acknowledgedOnConnection = acknowledged
        highestReceivedOnConnection = acknowledged
    }

    /// An event arrived; true when it is new and must be handed to the app.
    mutating func receive(seq: UInt64) -> Bool {
        highestReceivedOnConnection = max(highestReceivedOnConnection, seq)
        guard seq > lastDelivered else { return false }
        lastDelivered = seq
        return true
    }

    mutating func processed(seq: UInt64, epoch: Int) {
        guard epoch == self.epoch else { return }
        lastProcessed = max(lastProcessed, seq)
    }

    /// The cumulative ACK to send now, if any.
    var pendingAcknowledgement: UInt64? {
        let value = min(lastProcessed, highestReceivedOnConnection)
        return value > acknowledgedOnConnection ? value : nil
    }

    mutating func acknowledged(through seq: UInt64) { acknowledgedOnConnection = max(acknowledgedOnConnection, seq) }

    /// The resume point's `lastReceivedSeq`.
    var resumeSequence: UInt64 { lastProcessed }
}
