import SignalingPush
import SignalingSupport
import TestSupport

/// A gateway on a manual clock, pointed at a real recording HTTP server on loopback.
///
/// How tests step time: the gateway's loop reads the manual clock on every tick (2 ms
/// here), so a test advances the clock and then waits for two ticks (`advance`): by then
/// every retry or deferred wake-up that became due has been started. Back-off is pinned
/// to exactly 1 s unless a test changes it, so "advance 1 s" always releases a retry.
final class GatewayHarness {
    let http: RecordingHTTPServer
    let clock = ManualClock()
    let gateway: PushGateway

    init(start: Bool = true, _ configure: (inout PushGatewayConfiguration) -> Void = { _ in }) throws {
        http = try RecordingHTTPServer()
        var configuration = try PushGatewayConfiguration(url: http.url(path: "/wake"))
        configuration.tickInterval = .milliseconds(2)
        configuration.minimumBackoff = .seconds(1)
        configuration.maximumBackoff = .seconds(1)
        configure(&configuration)
        gateway = try PushGateway(configuration: configuration, clock: clock, logger: .silent)
        if start { try gateway.start() }
    }

    deinit {
        gateway.stop()
        http.stop()
    }

    var statistics: PushStatistics { gateway.statistics }

    /// Moves the clock and waits until the gateway has acted on the new time.
    func advance(by duration: Duration) throws {
        clock.advance(by: duration)
        try settle()
    }

    /// Waits for two ticks of the gateway's loop (everything due has been started).
    func settle() throws {
        guard gateway.awaitTicks(2) else { throw TestFailure("the gateway did not tick") }
    }

    /// Waits (bounded) until `condition` holds on the gateway's statistics.
    func waitFor(_ what: String, timeout: Duration = .seconds(10), _ condition: (PushStatistics) -> Bool) throws {
        let deadline = SystemClock().now() + timeout
        while !condition(gateway.statistics) {
            guard SystemClock().now() < deadline else {
                throw TestFailure("timed out waiting for \(what); \(gateway.statistics)")
            }
            _ = gateway.awaitTicks(1, timeout: .milliseconds(100))
        }
    }

    /// Waits (bounded) until the HTTP server has received `count` requests.
    func waitForRequests(_ count: Int) throws {
        guard http.waitForRequests(count) else {
            throw TestFailure("expected \(count) requests, got \(http.requests.count); \(gateway.statistics)")
        }
    }

    /// The JSON objects of every request received so far.
    func bodies() throws -> [[String: Any]] {
        try http.requests.map { request in
            guard let object = jsonObject(request.body) else { throw TestFailure("not JSON: \(request.bodyText)") }
            return object
        }
    }
}
