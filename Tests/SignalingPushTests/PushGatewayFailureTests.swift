import SignalingStore
import SignalingSupport
import Testing
import TestSupport
@testable import SignalingPush

/// A gateway that fails, refuses, is down, hangs or trickles: wake-ups are retried or
/// given up as documented, and nothing blocks.
@Suite("Push gateway: failures")
struct PushGatewayFailureTests {
    @Test("statuses: 2xx delivered; 408, 429, 5xx and no answer retried; other codes rejected")
    func outcomes() {
        #expect(GatewayLoop.outcome(status: 200, retryAfter: nil) == .delivered)
        #expect(GatewayLoop.outcome(status: 204, retryAfter: nil) == .delivered)
        #expect(GatewayLoop.outcome(status: 0, retryAfter: nil) == .failed(retryAfter: nil))
        #expect(GatewayLoop.outcome(status: 500, retryAfter: "5") == .failed(retryAfter: nil))
        #expect(GatewayLoop.outcome(status: 503, retryAfter: "5") == .failed(retryAfter: .seconds(5)))
        #expect(GatewayLoop.outcome(status: 429, retryAfter: "9") == .failed(retryAfter: .seconds(9)))
        #expect(GatewayLoop.outcome(status: 408, retryAfter: nil) == .failed(retryAfter: nil))
        #expect(GatewayLoop.outcome(status: 400, retryAfter: nil) == .rejected(reason: "400"))
        #expect(GatewayLoop.outcome(status: 410, retryAfter: nil) == .rejected(reason: "410"))
        #expect(GatewayLoop.outcome(status: 302, retryAfter: nil) == .rejected(reason: "302"))
    }

    @Test("500 is retried after back-off with the same id, and then delivered")
    func retryAfterServerError() throws {
        let harness = try GatewayHarness()
        harness.http.script([.status(500)])
        harness.gateway.submit(wakeUp())
        try harness.waitFor("first attempt failed") { $0.failedAttempts == 1 && $0.retried == 1 }
        try harness.settle()
        #expect(harness.http.requests.count == 1)  // the back-off has not passed on the clock
        try harness.advance(by: .seconds(1))
        try harness.waitFor("delivered") { $0.sent == 1 }
        let bodies = try harness.bodies()
        #expect(bodies.count == 2)
        #expect(bodies[0]["id"] as? String == bodies[1]["id"] as? String)
        #expect(bodies.map { $0["attempt"] as? Int } == [1, 2])
    }

    @Test("a gateway that is down (connection refused) is retried until it is up")
    func connectionRefused() throws {
        let harness = try GatewayHarness()
        harness.http.stopListening()
        harness.gateway.submit(wakeUp())
        try harness.waitFor("refused") { $0.failedAttempts == 1 && $0.retried == 1 }
        try harness.advance(by: .seconds(1))
        try harness.waitFor("refused again") { $0.failedAttempts == 2 && $0.retried == 2 }
        try harness.http.startListening()
        try harness.advance(by: .seconds(1))
        try harness.waitFor("delivered") { $0.sent == 1 }
        #expect(harness.http.requests.count == 1)
        #expect(try harness.bodies().first?["attempt"] as? Int == 3)
    }

    @Test("a connection closed without an answer is a failed attempt, retried")
    func closedWithoutAnswer() throws {
        let harness = try GatewayHarness()
        harness.http.script([.closeConnection])
        harness.gateway.submit(wakeUp())
        try harness.waitFor("failed") { $0.failedAttempts == 1 && $0.retried == 1 }
        try harness.advance(by: .seconds(1))
        try harness.waitFor("delivered") { $0.sent == 1 }
        #expect(harness.http.requests.count == 2)
    }

    @Test("400 is a rejection: counted and never retried")
    func badRequestNotRetried() throws {
        let harness = try GatewayHarness()
        harness.http.script([.status(400)])
        harness.gateway.submit(wakeUp())
        try harness.waitFor("rejected") { $0.rejected == 1 }
        try harness.advance(by: .seconds(3600))
        #expect(harness.http.requests.count == 1)
        let stats = harness.statistics
        #expect(stats.failedAttempts == 1 && stats.retried == 0 && stats.sent == 0 && stats.inFlight == 0)
    }

    @Test("429 with Retry-After is retried no earlier than advised")
    func tooManyRequests() throws {
        let harness = try GatewayHarness { $0.maximumBackoff = .seconds(60) }
        harness.http.script([.status(429, headers: ["Retry-After": "30"])])
        harness.gateway.submit(wakeUp())
        try harness.waitFor("throttled") { $0.failedAttempts == 1 && $0.retried == 1 }
        try harness.advance(by: .seconds(29))
        #expect(harness.http.requests.count == 1)
        try harness.advance(by: .seconds(1))
        try harness.waitFor("delivered") { $0.sent == 1 }
    }

    @Test("after the last allowed attempt a wake-up is dropped and counted")
    func givesUp() throws {
        let harness = try GatewayHarness { $0.maxAttempts = 3 }
        harness.http.reply(.status(503))
        harness.gateway.submit(wakeUp())
        for attempt in 1...3 {
            try harness.waitFor("attempt \(attempt) failed") { $0.failedAttempts == attempt }
            try harness.advance(by: .seconds(1))
        }
        try harness.waitFor("given up") { $0.droppedExpired == 1 }
        try harness.advance(by: .seconds(60))
        #expect(harness.http.requests.count == 3)
        #expect(harness.statistics.retried == 2)
    }

    @Test("a hanging gateway: 1000 submits are all accepted at once; timeouts fail attempts, which are retried")
    func hangingGateway() throws {
        let harness = try GatewayHarness {
            $0.requestTimeout = .milliseconds(200)
            $0.maxConcurrentRequests = 4
        }
        harness.http.reply(.hang)
        var accepted = 0
        for index in 0..<1000 where harness.gateway.submit(wakeUp(device: "d\(index)", pending: index)) { accepted += 1 }
        #expect(accepted == 1000)
        #expect(harness.statistics.submitted == 1000)
        #expect(harness.statistics.droppedQueueFull == 0)
        try harness.waitFor("requests hanging") { $0.inFlight == 4 }
        #expect(harness.http.waitForRequests(4))
        try harness.waitFor("timeouts") { $0.failedAttempts >= 4 && $0.retried >= 4 }
        let stats = harness.statistics
        #expect(stats.inFlight <= 4)
        #expect(stats.sent == 0)
    }

    @Test("a gateway trickling its answer is cut off at the request timeout")
    func tricklingGateway() throws {
        let harness = try GatewayHarness { $0.requestTimeout = .milliseconds(300) }
        // 200 OK at one byte per 100 ms: each read is quick, the whole answer is not.
        harness.http.reply(.trickle(millisecondsPerByte: 100))
        harness.gateway.submit(wakeUp())
        try harness.waitFor("timed out") { $0.failedAttempts == 1 && $0.retried == 1 }
        #expect(harness.statistics.sent == 0)
    }

    @Test("stop with requests in flight returns, cancels them, closes every connection, and refuses later submits")
    func stopInFlight() throws {
        let harness = try GatewayHarness { $0.maxConcurrentRequests = 3 }
        harness.http.reply(.hang)
        for index in 0..<5 { harness.gateway.submit(wakeUp(device: "d\(index)")) }
        try harness.waitFor("three in flight") { $0.inFlight == 3 }
        #expect(harness.http.waitForRequests(3))
        harness.gateway.stop()
        let stats = harness.statistics
        #expect(stats.inFlight == 0)
        #expect(stats.droppedStopped == 5)  // three in flight, two waiting
        // The gateway's sockets are closed: nothing leaked.
        #expect(harness.http.waitUntil { $0.openConnections == 0 })
        let late = harness.gateway.submit(wakeUp(device: "late"))
        #expect(!late)
        #expect(harness.statistics.droppedStopped == 6)
        harness.gateway.stop()
        #expect(!harness.gateway.awaitTicks(1, timeout: .milliseconds(50)))
    }

    @Test("a gateway released without stop stops itself and closes its connections")
    func releasedWithoutStop() throws {
        let http = try RecordingHTTPServer()
        defer { http.stop() }
        http.reply(.hang)
        do {
            var configuration = try PushGatewayConfiguration(url: http.url())
            configuration.tickInterval = .milliseconds(2)
            let gateway = try PushGateway(configuration: configuration, clock: ManualClock(), logger: .silent)
            try gateway.start()
            gateway.submit(wakeUp())
            #expect(http.waitForRequests(1))
        }
        #expect(http.waitUntil { $0.openConnections == 0 })
    }
}
