import SignalingStore
import SignalingSupport
import Testing
import TestSupport
@testable import SignalingPush

/// The gateway against a real HTTP listener on loopback: what arrives, and when.
@Suite("Push gateway: delivery over HTTP")
struct PushGatewayDeliveryTests {
    @Test("one wake-up arrives as a small JSON POST with exactly the documented fields")
    func oneWakeUp() throws {
        let harness = try GatewayHarness()
        let accepted = harness.gateway.submit(wakeUp(user: "bob", device: "phone", kind: .call, pending: 3))
        #expect(accepted)
        try harness.waitForRequests(1)
        let request = harness.http.requests[0]
        #expect(request.method == "POST")
        #expect(request.path == "/wake")
        #expect(request.header("Content-Type") == "application/json")
        #expect(request.header("Host") == "127.0.0.1:\(harness.http.port)")
        #expect(request.header("Content-Length") == String(request.body.count))
        let body = try #require(jsonObject(request.body))
        // Nothing but the documented fields: no message text, no call offer can travel.
        #expect(Set(body.keys) == documentedWakeUpFields)
        #expect(body["user"] as? String == "bob")
        #expect(body["device"] as? String == "phone")
        #expect(body["kind"] as? String == "call")
        #expect(body["pending"] as? Int == 3)
        #expect(body["platform"] as? String == "apns")
        #expect(body["tokenEncoding"] as? String == "hex")
        #expect((body["token"] as? String)?.count == 64)
        #expect(body["attempt"] as? Int == 1)
        #expect(request.body.count < 400)
        try harness.waitFor("sent") { $0.sent == 1 && $0.inFlight == 0 }
    }

    @Test("ten events submitted in a burst before the thread runs become one request, pending=10")
    func burstBeforeStart() throws {
        let harness = try GatewayHarness(start: false)
        for pending in 1...10 { harness.gateway.submit(wakeUp(kind: pending == 5 ? .call : .message, pending: pending)) }
        try harness.gateway.start()
        try harness.waitFor("sent") { $0.sent == 1 }
        try harness.settle()
        let bodies = try harness.bodies()
        #expect(bodies.count == 1)
        #expect(bodies.first?["pending"] as? Int == 10)
        #expect(bodies.first?["kind"] as? String == "call")
        #expect(harness.statistics.submitted == 10)
        #expect(harness.statistics.coalesced == 9)
    }

    @Test("a burst while running: one request now, at most one more after the interval, with the latest counter")
    func burstWhileRunning() throws {
        let harness = try GatewayHarness()
        for pending in 1...10 { harness.gateway.submit(wakeUp(pending: pending)) }
        try harness.waitFor("first sent") { $0.sent == 1 }
        try harness.settle()  // the inbox has been taken in
        #expect(harness.http.requests.count == 1)
        try harness.advance(by: .seconds(10))
        try harness.waitFor("the follow-up, if any, sent") { $0.inFlight == 0 && $0.sent == 1 + $0.rateLimited }
        let bodies = try harness.bodies()
        #expect(bodies.count <= 2)
        #expect(bodies.last?["pending"] as? Int == 10)
        // Every submission is accounted for: a wake-up of its own or folded into one.
        let stats = harness.statistics
        #expect(stats.submitted == 10 && stats.coalesced == 10 - bodies.count)
    }

    @Test("the per-device interval holds the next wake-up back on the injected clock")
    func rateLimit() throws {
        let harness = try GatewayHarness()
        harness.gateway.submit(wakeUp(device: "phone", pending: 1))
        try harness.waitFor("first sent") { $0.sent == 1 }
        harness.gateway.submit(wakeUp(device: "phone", pending: 2))
        harness.gateway.submit(wakeUp(device: "tablet", pending: 1))  // another device is not held
        try harness.waitFor("second deferred") { $0.rateLimited == 1 && $0.sent == 2 }
        try harness.settle()
        #expect(harness.http.requests.count == 2)
        try harness.advance(by: .seconds(9))
        #expect(harness.http.requests.count == 2)
        try harness.advance(by: .seconds(1))
        try harness.waitForRequests(3)
        let last = try #require(try harness.bodies().last)
        #expect(last["device"] as? String == "phone" && last["pending"] as? Int == 2)
    }

    @Test("several wake-ups reuse one kept-alive connection")
    func keepAlive() throws {
        let harness = try GatewayHarness { $0.maxConcurrentRequests = 1 }
        for device in ["a", "b", "c"] { harness.gateway.submit(wakeUp(device: device)) }
        try harness.waitFor("all sent") { $0.sent == 3 }
        #expect(harness.http.connectionsAccepted == 1)
    }

    @Test("a wake-up over the body cap is not sent and is counted; others still go")
    func sizeCap() throws {
        let harness = try GatewayHarness()
        harness.gateway.submit(wakeUp(device: "huge", token: [UInt8](repeating: 0xAB, count: 2100)))
        harness.gateway.submit(wakeUp(device: "small"))
        try harness.waitFor("one sent, one dropped") { $0.sent == 1 && $0.droppedOversize == 1 }
        try harness.settle()
        #expect(harness.http.requests.count == 1)
        #expect(try harness.bodies().first?["device"] as? String == "small")
    }

    @Test("beyond the queued-device cap, submit refuses at once and counts")
    func queueFull() throws {
        let harness = try GatewayHarness(start: false) { $0.maxQueuedDevices = 5 }
        var accepted = 0
        for index in 0..<8 where harness.gateway.submit(wakeUp(device: "d\(index)")) { accepted += 1 }
        #expect(accepted == 5)
        #expect(harness.statistics.droppedQueueFull == 3)
        try harness.gateway.start()
        try harness.waitFor("five sent") { $0.sent == 5 }
    }
}
