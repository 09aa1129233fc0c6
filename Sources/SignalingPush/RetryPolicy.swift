/// When a failed wake-up is tried again: exponential back-off with full jitter above a
/// floor, so that many devices failing together (a gateway outage) do not retry in step.
struct RetryPolicy: Sendable {
    var minimumBackoff: Duration
    var maximumBackoff: Duration
    var maxAttempts: Int
    var maxAge: Duration

    init(_ configuration: PushGatewayConfiguration) {
        minimumBackoff = configuration.minimumBackoff
        maximumBackoff = configuration.maximumBackoff
        maxAttempts = configuration.maxAttempts
        maxAge = configuration.maxAge
    }

    init(minimumBackoff: Duration, maximumBackoff: Duration, maxAttempts: Int, maxAge: Duration) {
        self.minimumBackoff = minimumBackoff
        self.maximumBackoff = maximumBackoff
        self.maxAttempts = maxAttempts
        self.maxAge = maxAge
    }

    /// The largest wait before retry number `failures` (1 = after the first failure):
    /// minimum × 2^(failures-1), capped at the maximum.
    func ceiling(afterFailures failures: Int) -> Duration {
        let exponent = min(max(failures - 1, 0), 40)
        let nanos = Double(Self.nanoseconds(minimumBackoff)) * Double(UInt64(1) << UInt64(exponent))
        return .nanoseconds(Int64(min(nanos, Double(Self.nanoseconds(maximumBackoff)))))
    }

    /// A random wait in [minimum, ceiling]; never shorter than `retryAfter` (the gateway's
    /// Retry-After advice), which is itself capped at the maximum back-off.
    func delay(afterFailures failures: Int, retryAfter: Duration? = nil, using random: inout some RandomNumberGenerator) -> Duration {
        let low = Self.nanoseconds(minimumBackoff)
        let high = max(low, Self.nanoseconds(ceiling(afterFailures: failures)))
        var chosen = Int64.random(in: low...high, using: &random)
        if let retryAfter {
            chosen = max(chosen, min(Self.nanoseconds(retryAfter), Self.nanoseconds(maximumBackoff)))
        }
        return .nanoseconds(chosen)
    }

    static func nanoseconds(_ duration: Duration) -> Int64 {
        let (seconds, attoseconds) = duration.components
        let (scaled, overflow) = seconds.multipliedReportingOverflow(by: 1_000_000_000)
        return overflow ? Int64.max / 2 : scaled + attoseconds / 1_000_000_000
    }

    /// Parses a Retry-After header given in seconds. The HTTP-date form is ignored (the
    /// normal back-off applies then): gateways answer 429/503 with seconds in practice.
    static func retryAfter(header: String?) -> Duration? {
        guard let text = header?.trimmingWhitespace, !text.isEmpty, let seconds = Int64(text), seconds >= 0 else { return nil }
        return .seconds(min(seconds, 86_400))
    }
}

extension String {
    fileprivate var trimmingWhitespace: Substring {
        let trimmed = drop(while: { $0 == " " || $0 == "\t" })
        return trimmed[..<(trimmed.lastIndex(where: { $0 != " " && $0 != "\t" }).map { trimmed.index(after: $0) } ?? trimmed.startIndex)]
    }
}
