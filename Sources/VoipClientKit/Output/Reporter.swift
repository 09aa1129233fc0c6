import SignalingSupport

/// One thing that happened, in both output forms: the JSON object's event name and fields
/// (docs/VOIPCLIENT.md lists them), and the line for people.
public struct ReportEvent: Sendable, Equatable {
    public var name: String
    public var fields: [JSONField]
    /// The text line; nil when the event is for scripts only.
    public var text: String?

    public init(_ name: String, _ fields: [JSONField], text: String?) {
        self.name = name
        self.fields = fields
        self.text = text
    }

    /// The `--json` line: `{"event":NAME,"ts":MS_SINCE_EPOCH,...fields}`.
    public func jsonLine(wallMilliseconds: UInt64) -> String {
        JSONValue.object([JSONField("event", .string(name)), JSONField("ts", .unsigned(wallMilliseconds))] + fields).serialized
    }
}

/// Writes events to stdout (text or JSON lines) and failure reasons to stderr. Each line
/// is a single write, so lines from different queues never interleave.
public struct Reporter: Sendable {
    public let json: Bool
    let clock: any Clock

    public init(json: Bool, clock: any Clock = SystemClock()) {
        self.json = json
        self.clock = clock
    }

    public func emit(_ event: ReportEvent) {
        if json {
            StandardStreams.output(event.jsonLine(wallMilliseconds: clock.wallMilliseconds()) + "\n")
        } else if let text = event.text {
            StandardStreams.output(text + "\n")
        }
    }

    /// The last event of a scripted command (`result`), and the one-line reason on stderr
    /// when it failed.
    public func finish(_ outcome: Outcome, _ fields: [JSONField] = []) {
        emit(Reports.result(outcome, fields))
        if outcome.status != .ok { StandardStreams.error("voipclient: \(outcome.reason)\n") }
    }
}
