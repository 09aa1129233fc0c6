import SignalingProtocol

/// One call of the interactive session, as the console shows it.
struct CallRecord: Sendable, Equatable {
    enum Direction: String, Sendable { case outgoing = "out", incoming = "in" }

    enum State: Sendable, Equatable {
        /// Outgoing: invited, no device rings yet.
        case inviting
        /// Outgoing: a callee device rings. Incoming: we ring.
        case ringing
        /// Incoming: our answer is on its way.
        case answering
        case active
        /// Over; says how ("bob hung up", "you cancelled", "failed: ...").
        case ended(String)
    }

    let id: String
    let direction: Direction
    let peer: String
    var peerDevice: String?
    var state: State
    var timeline = CallTimeline()
    /// Wall-clock time it started (for display).
    let startedAtWall: UInt64
    var probeResult: ProbeStatistics?

    var isOver: Bool { if case .ended = state { return true } else { return false } }
}

/// The calls of the session, oldest first, and the rules to pick one from what was
/// typed ("answer", "hangup 3f2a", "reject bob").
struct CallBook: Sendable {
    private(set) var records: [CallRecord] = []
    /// Ended calls kept for `calls` (the oldest are dropped beyond this).
    static let endedCallsKept = 100

    mutating func add(_ record: CallRecord) {
        records.append(record)
        let ended = records.filter(\.isOver)
        if ended.count > Self.endedCallsKept, let oldest = ended.first, let index = records.firstIndex(where: { $0.id == oldest.id }) {
            records.remove(at: index)
        }
    }

    subscript(id: String) -> CallRecord? {
        get { records.first { $0.id == id } }
        set {
            guard let index = records.firstIndex(where: { $0.id == id }) else { return }
            if let newValue { records[index] = newValue } else { records.remove(at: index) }
        }
    }

    /// Incoming calls that ring now (the console rings while there are any).
    var ringingIncoming: [CallRecord] {
        records.filter { $0.direction == .incoming && $0.state == .ringing }
    }

    /// The call a command means: among those `eligible`, the one `reference` names (a
    /// call-id prefix or the peer), or the only one when there is no reference.
    func resolve(_ reference: String?, what: String, eligible: (CallRecord) -> Bool) -> Result<CallRecord, CallLookupError> {
        let candidates = records.filter(eligible)
        let matches = reference.map { reference in
            candidates.filter { $0.id.hasPrefix(reference) || $0.peer == reference }
        } ?? candidates
        switch matches.count {
        case 1: return .success(matches[0])
        case 0: return .failure(CallLookupError(message: reference.map { "no \(what) call matches '\($0)'" } ?? "no \(what) call"))
        default:
            let list = matches.map { "\(Format.short($0.id)) (\($0.peer))" }.joined(separator: ", ")
            return .failure(CallLookupError(message: "several \(what) calls: \(list); say which"))
        }
    }
}

struct CallLookupError: Error, Equatable, CustomStringConvertible {
    var message: String
    var description: String { message }
}

/// One message of the interactive session.
struct MessageRecord: Sendable, Equatable {
    enum State: Sendable, Equatable {
        case received
        case sending
        case accepted
        case delivered([String])
        case failed(String)
    }

    let id: String
    let incoming: Bool
    let peer: String
    let text: String
    let atWall: UInt64
    var state: State
}

/// The messages of the session, oldest first (bounded).
struct MessageHistory: Sendable {
    private(set) var records: [MessageRecord] = []
    static let kept = 1000

    mutating func add(_ record: MessageRecord) {
        records.append(record)
        if records.count > Self.kept { records.removeFirst(records.count - Self.kept) }
    }

    mutating func update(_ id: String, _ change: (inout MessageRecord) -> Void) {
        guard let index = records.lastIndex(where: { $0.id == id && !$0.incoming }) else { return }
        change(&records[index])
    }
}
