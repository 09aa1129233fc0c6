import Foundation
import Testing
import SignalingProtocol
import SignalingPush
import SignalingServer
import SignalingSupport
import TestSupport
@testable import SignalingClient

@Suite("Push wake-ups: handleWakeUp connects, delivers what is pending, ends its task")
struct WakeUpTests {
    private func suspended(_ test: TestClient, _ clock: ManualClock) {
        test.client.applicationDidEnterBackground()
        test.advance(clock, by: .seconds(10))
    }

    private func runs(_ test: TestClient) -> [WakeUpRun] { test.core.queue.sync { Array(test.core.push.wakeUps.values) } }

    @Test("end to end: the webhook registration reaches the server, its wake-up's payload brings the suspended device back for its messages")
    func endToEnd() throws {
        let gateway = try RecordingHTTPServer()
        let server = try RealServer { configuration in
            var push = try! PushGatewayConfiguration(url: gateway.url())
            push.tickInterval = .milliseconds(5)
            configuration.pushGateway = push
        }
        let clock = ManualClock()
        let bob = try TestClient(port: server.port, user: "bob", device: "phone", clock: clock)
        let alice = try TestClient(port: server.port, user: "alice", device: "laptop")
        defer { bob.client.shutdown(); alice.client.shutdown() }

        try bob.connectAndSettle()
        #expect(try bob.request { bob.client.registerPush(kind: .webhook(platform: "acme"), token: Array("bob-token".utf8), completion: $0) }.isSuccess)
        bob.client.disconnect()
        #expect(poll(until: Date(timeIntervalSinceNow: 10)) { server.server.statistics.establishedConnections == 0 })
        suspended(bob, clock)
        #expect(bob.client.applicationState == .suspended)

        try alice.connectAndSettle()
        for index in 1...3 {
            #expect(try alice.request { alice.client.send(to: "bob", body: Array("hi \(index)".utf8), messageID: "m\(index)", completion: $0) }.isSuccess)
        }
        #expect(gateway.waitForRequests(1))
        let wake = try #require(try JSONSerialization.jsonObject(with: Data(gateway.requests[0].body)) as? [String: Any])
        #expect(wake["platform"] as? String == "acme" && wake["token"] as? String == "bob-token")

        let payload = WakeUpPayload(json: gateway.requests[0].body)
        #expect(payload.userID == "bob" && payload.deviceID == "phone" && payload.kind == .message)
        let outcome = AsyncValue<(WakeUpOutcome, messagesSeen: Int)>()
        bob.client.handleWakeUp(payload: payload) { outcome.set(.success(($0, bob.recorder.messages.count))) }
        let (result, messagesSeen) = try outcome.value()

        #expect(result.ending == .delivered, "\(result.ending)")
        #expect(result.session?.resumed == true, "the wake-up resumes the session")
        #expect(result.eventsProcessed == 3)
        #expect(messagesSeen == 3, "the outcome comes after the handlers of the pending events")
        #expect(bob.recorder.messages.map(\.messageID) == ["m1", "m2", "m3"])
        let woken = try #require(bob.recorder.all.firstIndex(of: .woken(.pushNotification)))
        let firstMessage = try #require(bob.recorder.all.firstIndex { if case .messageReceived = $0 { return true } else { return false } })
        #expect(woken < firstMessage)
        // The task ended by itself, with the clock standing still: nothing waited for the budget.
        #expect(bob.core.queue.sync { bob.core.background.runningTasks.isEmpty })
        #expect(!bob.recorder.all.contains { if case .backgroundTaskExpired = $0 { return true } else { return false } })
        #expect(runs(bob).isEmpty)
        // The ACKs reached the server: alice hears that bob's phone has every message.
        #expect(alice.recorder.wait { events in
            Set(events.compactMap { if case .deliveryReceipt(let receipt) = $0 { return receipt.messageID } else { return nil } }) == ["m1", "m2", "m3"]
        })
        // Once the wake slice is over the app is suspended again, with its socket still up
        // (after the barrier PING's answer: the run may end before it, on WELCOME's lastSeq).
        #expect(bob.recorder.wait { $0.contains { if case .keepAliveAnswered = $0 { return true } else { return false } } })
        bob.advance(clock, by: .seconds(10))
        #expect(bob.client.applicationState == .suspended)
        #expect(bob.socket != nil)
    }

    /// Accepts the wake-up's connection and answers WELCOME with the given `lastSeq`.
    private func acceptWakeUpConnection(_ server: ScriptedServer, lastSeq: UInt64) throws -> PeerConnection {
        let peer = try server.accept()
        _ = try peer.expectHello()
        try peer.send(.welcome(Welcome(
            sessionID: SessionID(high: 3, low: 4), resumed: false, keepAliveSeconds: 600, idleTimeoutSeconds: 900,
            serverTime: 1, maxFrameLength: 65_536, ackedSeq: 0, lastSeq: lastSeq)))
        return peer
    }

    @Test("events that never come: the run ends its task at the budget (allowance less the expiration warning), not before")
    func budget() throws {
        let clock = ManualClock()
        let server = try ScriptedServer()
        let test = try TestClient(port: server.port, clock: clock) { $0.pongTimeout = .seconds(120) }
        defer { test.client.shutdown() }
        suspended(test, clock)
        let outcome = AsyncValue<WakeUpOutcome>()
        test.client.handleWakeUp(payload: WakeUpPayload(kind: .call)) { outcome.set(.success($0)) }
        let peer = try acceptWakeUpConnection(server, lastSeq: 5)
        defer { peer.close() }
        #expect(try peer.readFrame() == .ping, "the barrier PING, left unanswered")
        #expect(poll(until: Date(timeIntervalSinceNow: 10)) { runs(test).first?.connected == true })

        test.advance(clock, by: .milliseconds(24_900))
        #expect(runs(test).count == 1, "still waiting for seq 5")
        #expect(test.client.backgroundTimeRemaining > 5)
        test.advance(clock, by: .milliseconds(100))
        let result = try outcome.value()
        #expect(result.ending == .budgetExhausted && result.duration == .seconds(25) && result.eventsProcessed == 0)
        #expect(test.core.queue.sync { test.core.background.runningTasks.isEmpty })
        #expect(!test.recorder.all.contains { if case .backgroundTaskExpired = $0 { return true } else { return false } })
        #expect(test.client.applicationState == .suspended)
    }

    @Test("numbers with no event at the end (WELCOME lastSeq 70, one event): the PONG ends the run once the event is processed")
    func pongBarrier() throws {
        let clock = ManualClock()
        let server = try ScriptedServer()
        let test = try TestClient(port: server.port, clock: clock)
        defer { test.client.shutdown() }
        suspended(test, clock)
        let outcome = AsyncValue<WakeUpOutcome>()
        test.client.handleWakeUp(payload: WakeUpPayload(kind: .message, pending: 1)) { outcome.set(.success($0)) }
        let peer = try acceptWakeUpConnection(server, lastSeq: 70)
        defer { peer.close() }
        try peer.sendEvent(seq: 3, .message(DeliveredMessage(
            messageID: "m", sender: "alice", senderDevice: "a", recipient: "alice", contentType: "text/plain", body: [1], serverTime: 2)))
        let (_, before) = try peer.readUntil { $0 == .ping }
        #expect(runs(test).count == 1)
        try peer.send(.pong)
        let result = try outcome.value()
        #expect(result.ending == .delivered && result.eventsProcessed == 1 && result.payload.pending == 1)
        #expect(test.recorder.messages.map(\.messageID) == ["m"])
        // The event was acknowledged (before or after the PING, as the app's queue went).
        if !before.contains(.ack(seq: 3)) { _ = try peer.readUntil { $0 == .ack(seq: 3) } }
    }

    @Test("a connect that fails ends the run and its task at once; the client keeps trying by itself")
    func connectFails() throws {
        let clock = ManualClock()
        let port = try ReservedPort()
        let test = try TestClient(port: port.port, clock: clock)
        defer { test.client.shutdown() }
        suspended(test, clock)
        let outcome = AsyncValue<WakeUpOutcome>()
        test.client.handleWakeUp(payload: WakeUpPayload()) { outcome.set(.success($0)) }
        let result = try outcome.value()
        guard case .connectFailed(.refused) = result.ending else { Issue.record("\(result.ending)"); return }
        #expect(test.core.queue.sync { test.core.background.runningTasks.isEmpty })
        #expect(test.recorder.wait { $0.contains(where: \.isWaiting) })
    }

    @Test("a payload for another user or device does nothing")
    func notForThisDevice() throws {
        let test = try TestClient(port: 9, user: "alice", device: "phone")
        defer { test.client.shutdown() }
        let outcome = AsyncValue<WakeUpOutcome>()
        test.client.handleWakeUp(dictionary: ["vs": ["user": "alice", "device": "tablet", "kind": "call"]]) { outcome.set(.success($0)) }
        #expect(try outcome.value().ending == .notForThisDevice)
        test.settle()
        #expect(test.recorder.all.isEmpty, "no wake, no connect")
    }

    @Test("payloads: APNs under \"vs\", FCM data with string values, the webhook JSON, junk")
    func payloads() {
        let apns = WakeUpPayload(dictionary: ["aps": ["content-available": 1],
                                              "vs": ["id": "w.1", "user": "bob", "device": "phone", "kind": "call", "pending": 2]])
        #expect(apns == WakeUpPayload(id: "w.1", userID: "bob", deviceID: "phone", kind: .call, pending: 2))
        let fcm = WakeUpPayload(dictionary: ["id": "w.2", "user": "bob", "device": "tab", "kind": "missedCall", "pending": "7"])
        #expect(fcm == WakeUpPayload(id: "w.2", userID: "bob", deviceID: "tab", kind: .missedCall, pending: 7))
        let webhook = WakeUpPayload(json: Array(#"{"id":"w.3","user":"bob","device":"phone","kind":"receipt","pending":1,"platform":"x"}"#.utf8))
        #expect(webhook == WakeUpPayload(id: "w.3", userID: "bob", deviceID: "phone", kind: .receipt, pending: 1))
        #expect(WakeUpPayload(json: Array("not json".utf8)) == WakeUpPayload())
        #expect(WakeUpPayload(dictionary: ["kind": "somethingNew", "pending": "many"]) == WakeUpPayload(kind: .other))
    }
}
