import SignalingSupport

/// When the steps of one call happened, on the monotonic clock: the figures a test call
/// reports (invite → ringing, invite → answer, answer → hang-up).
struct CallTimeline: Sendable, Equatable {
    var invitedAt: Instant?
    var ringingAt: Instant?
    var answeredAt: Instant?
    var endedAt: Instant?

    var inviteToRinging: Duration? { Self.span(invitedAt, ringingAt) }
    var inviteToAnswer: Duration? { Self.span(invitedAt, answeredAt) }
    /// How long the call was up.
    var answerToHangup: Duration? { Self.span(answeredAt, endedAt) }

    private static func span(_ from: Instant?, _ to: Instant?) -> Duration? {
        guard let from, let to else { return nil }
        return to - from
    }
}
