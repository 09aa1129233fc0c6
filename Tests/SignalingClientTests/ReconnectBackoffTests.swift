import Testing
import SignalingProtocol
import SignalingSupport
@testable import SignalingClient

@Suite("Reconnect back-off")
struct ReconnectBackoffTests {
    @Test("ceilings double from 0.5 s and stop at 60 s")
    func ceilings() {
        let policy = ReconnectPolicy()
        let expected: [Duration] = [.milliseconds(500), .seconds(1), .seconds(2), .seconds(4), .seconds(8), .seconds(16), .seconds(32), .seconds(60), .seconds(60)]
        #expect((0..<expected.count).map { policy.ceiling(forAttempt: $0) } == expected)
        #expect(policy.ceiling(forAttempt: 10_000) == .seconds(60))
    }

    @Test("full jitter: every delay lies in 0...ceiling, and they spread over the range")
    func fullJitter() {
        var generator = FastRandom(seed: 42)
        let policy = ReconnectPolicy()
        for attempt in 0..<12 {
            var delays: [Duration] = []
            for _ in 0..<200 {
                var backoff = ReconnectBackoff(policy: policy)
                for _ in 0..<attempt { _ = backoff.nextDelay(using: &generator) }
                delays.append(backoff.nextDelay(using: &generator))
            }
            let ceiling = policy.ceiling(forAttempt: attempt)
            #expect(delays.allSatisfy { $0 >= .zero && $0 <= ceiling })
            // Not a fixed delay: both halves of the range are used.
            #expect(delays.contains { $0 < ceiling / 2 } && delays.contains { $0 > ceiling / 2 })
        }
    }

    @Test("reset goes back to the first step")
    func reset() {
        var generator = FastRandom(seed: 7)
        var backoff = ReconnectBackoff(policy: ReconnectPolicy())
        for _ in 0..<9 { _ = backoff.nextDelay(using: &generator) }
        #expect(backoff.attempt == 9)
        backoff.reset()
        #expect(backoff.nextDelay(using: &generator) <= .milliseconds(500))
    }

    @Test("a CLOSE's advice: retryAfter plus 0...jitter")
    func advisedDelay() {
        var generator = FastRandom(seed: 1)
        let close = Close(code: .goingAway, retryAfterMs: 1000, retryJitterMs: 30_000, message: "restart")
        let delays = (0..<500).map { _ in ReconnectBackoff.advisedDelay(for: close, using: &generator) }
        #expect(delays.allSatisfy { $0 >= .seconds(1) && $0 <= .seconds(31) })
        #expect(delays.contains { $0 < .seconds(8) } && delays.contains { $0 > .seconds(24) })
        let noJitter = Close(code: .idleTimeout, retryAfterMs: 0, retryJitterMs: 0, message: "")
        #expect(ReconnectBackoff.advisedDelay(for: noJitter, using: &generator) == .zero)
    }
}
