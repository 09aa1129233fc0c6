/// Bounds of the exponential back-off with full jitter used after a connection was lost
/// without a CLOSE, or a connect attempt failed (AWS architecture blog, "Exponential
/// Backoff And Jitter"): attempt n (0-based) waits a uniformly random time in
/// `0 ... min(maximumDelay, initialDelay × 2ⁿ)`.
///
/// With the defaults the ceilings are 0.5, 1, 2, 4, 8, 16, 32, 60, 60... seconds: a lost
/// connection is usually back within a second, and a server that is down for long gets
/// at most one attempt per minute per device, spread evenly over the minute.
public struct ReconnectPolicy: Sendable, Equatable {
    /// The ceiling of the first attempt's random delay.
    public var initialDelay: Duration = .milliseconds(500)
    /// The largest ceiling; the delay never exceeds it.
    public var maximumDelay: Duration = .seconds(60)
    /// A connection that stayed up this long resets the back-off to its first step; a
    /// server that accepts and then drops at once keeps climbing instead of being hammered.
    public var stableConnection: Duration = .seconds(30)
    /// After the server's certificate was rejected or matched no pin, the next automatic
    /// attempt waits a random time in `certificateFailureDelay / 2 ... certificateFailureDelay`
    /// (not the back-off): such a failure repeats until the certificate is fixed or the
    /// device leaves the network that intercepts its TLS (a captive portal), so retrying
    /// sooner would only spend the battery and the server's handshakes. A network change,
    /// the return to the foreground and an explicit `connect` still try at once.
    public var certificateFailureDelay: Duration = .seconds(300)

    public init() {}

    public init(initialDelay: Duration, maximumDelay: Duration, stableConnection: Duration = .seconds(30)) {
        self.initialDelay = initialDelay
        self.maximumDelay = maximumDelay
        self.stableConnection = stableConnection
    }

    /// The ceiling of attempt `attempt` (0-based).
    public func ceiling(forAttempt attempt: Int) -> Duration {
        var ceiling = initialDelay
        var step = 0
        while step < attempt && ceiling < maximumDelay {
            ceiling = ceiling * 2
            step += 1
        }
        return min(ceiling, maximumDelay)
    }
}
