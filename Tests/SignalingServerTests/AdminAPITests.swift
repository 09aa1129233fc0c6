import Foundation
import SignalingCrypto
import SignalingProtocol
@testable import SignalingServer
import SignalingStore
import SignalingSupport
import Synchronization
import TestSupport
import Testing

/// The admin HTTP API (docs/ADMIN-API.md) over real HTTP on its own loopback port, with
/// real device connections and a store whose commits the tests can hold back.
@Suite("Admin API: health, metrics and backend calls over HTTP")
struct AdminAPITests {
    static let token = "s3cret-admin-token"

    func adminServer(store: (any EventStore)? = nil, token: String? = nil, workers: Int = 2) throws -> TestServer {
        try TestServer(workers: workers, store: store) {
            $0.admin = AdminConfiguration(host: "127.0.0.1", port: 0, token: token)
        }
    }

    func http(_ server: TestServer, _ method: String, _ path: String, json: String? = nil, token: String? = nil) throws -> HTTPReply {
        var headers: [String: String] = [:]
        if let token { headers["Authorization"] = "Bearer \(token)" }
        if json != nil { headers["Content-Type"] = "application/json" }
        return try HTTPRequest.send(method, port: server.server.adminPort!, path, body: json.map { Array($0.utf8) }, headers: headers)
    }

    func message(_ id: String, to recipient: String, _ text: String = "hello") -> Request {
        .messageSend(OutgoingMessage(messageID: id, recipient: recipient, contentType: "text/plain", body: Array(text.utf8)))
    }

    // MARK: Health

    @Test("a metric's HELP text escapes backslashes and line feeds but not quotes; label values escape quotes too")
    func prometheusEscaping() {
        #expect(PrometheusText.escapedHelp("plain \"quoted\" text") == "plain \"quoted\" text")
        #expect(PrometheusText.escapedHelp("a\\b\nc") == "a\\\\b\\nc")
        var out = PrometheusText()
        out.family("x_total", .counter, "Two\nlines.")
        out.sample("x_total", ["path": "C:\\\"q\""], 3)
        #expect(out.text == "# HELP x_total Two\\nlines.\n# TYPE x_total counter\nx_total{path=\"C:\\\\\\\"q\\\"\"} 3\n")
    }

    @Test("/healthz answers 200; /readyz answers 200 while serving and 503 once draining")
    func healthAndReadiness() throws {
        let server = try adminServer()
        let health = try http(server, "GET", "/healthz")
        #expect(health.status == 200)
        #expect(health.text == "ok\n")
        let ready = try http(server, "GET", "/readyz")
        #expect(ready.status == 200)
        #expect(ready.json?["ready"] as? Bool == true)

        let (alice, _) = try server.connect(user: "alice")
        server.server.beginShutdown()
        let draining = try http(server, "GET", "/readyz")
        #expect(draining.status == 503)
        #expect((draining.json?["reasons"] as? [String])?.contains("draining") == true)
        #expect(try alice.expectClose().code == .goingAway)
        #expect(try http(server, "GET", "/healthz").status == 200)
    }

    @Test("/readyz answers 503 while the store fails, and 200 again once it commits")
    func readinessFollowsTheStore() throws {
        let store = ModelEventStore()
        let server = try adminServer(store: store)
        let (alice, _) = try server.connect(user: "alice")
        _ = try server.connect(user: "bob")
        store.failCommits(with: StoreError(.full, "disk full"))
        try alice.send(.request(id: 1, message("m1", to: "bob")))  // answered at the store timeout
        try server.waitFor("the store to be unhealthy") { !$0.storeHealthy }
        let unready = try http(server, "GET", "/readyz")
        #expect(unready.status == 503)
        #expect((unready.json?["reasons"] as? [String])?.contains("store unhealthy") == true)
        store.failCommits(with: nil)
        try server.waitFor("the store to recover") { $0.storeHealthy }
        #expect(try http(server, "GET", "/readyz").status == 200)
    }

    // MARK: Authentication

    @Test("with a token, every endpoint but the probes needs 'Authorization: Bearer <token>'")
    func bearerToken() throws {
        let server = try adminServer(token: Self.token)
        #expect(try http(server, "GET", "/healthz").status == 200)
        #expect(try http(server, "GET", "/readyz").status == 200)
        for (method, path) in [("GET", "/metrics"), ("GET", "/v1/users/bob/devices"), ("DELETE", "/v1/users/bob"), ("POST", "/v1/messages")] {
            let anonymous = try http(server, method, path, json: method == "POST" ? "{}" : nil)
            #expect(anonymous.status == 401, "\(method) \(path)")
            #expect(anonymous.json?["error"] as? String == "unauthorized")
            #expect(try http(server, method, path, token: "wrong").status == 401)
            #expect(try http(server, method, path, token: Self.token + "x").status == 401)
        }
        #expect(try http(server, "GET", "/metrics", token: Self.token).status == 200)
    }

    @Test("an unknown path is 404 and a wrong method 405, both with a JSON error")
    func unknownEndpoints() throws {
        let server = try adminServer()
        let missing = try http(server, "GET", "/v2/nothing")
        #expect(missing.status == 404)
        #expect(missing.json?["error"] as? String == "notFound")
        let wrongMethod = try http(server, "GET", "/v1/messages")
        #expect(wrongMethod.status == 405)
        #expect(wrongMethod.json?["error"] as? String == "methodNotAllowed")
        #expect(try http(server, "POST", "/v1/users/bob/devices", json: "{}").status == 405)
    }

    // MARK: POST /v1/messages

    @Test("POST /v1/messages delivers a system message, answers only once committed, and de-duplicates by messageId")
    func systemMessage() throws {
        let store = ModelEventStore()
        let server = try adminServer(store: store)
        let (bob, _) = try server.connect(user: "bob")
        try server.waitFor("bob's device to be stored") { _ in (try? store.loadSnapshot().devices.count) == 1 }

        // The answer waits for the commit.
        store.closeGate()
        let answer = Mutex<HTTPReply?>(nil)
        let port = server.server.adminPort!
        let sender = JoinableThread {
            let reply = try? HTTPRequest.send(
                "POST", port: port, "/v1/messages",
                body: Array(#"{"to":"bob","messageId":"welcome-1","body":"Welcome!","from":"billing"}"#.utf8))
            answer.withLock { $0 = reply }
        }
        try server.waitFor("the commit to reach the store") { _ in store.appliesWaitingAtGate == 1 }
        #expect(answer.withLock { $0 } == nil, "answered before the commit")
        store.openGate()
        sender.join()
        let reply = try #require(answer.withLock { $0 })
        #expect(reply.status == 200)
        #expect(reply.headers["content-type"] == "application/json")
        #expect(reply.json?["messageId"] as? String == "welcome-1")
        #expect(reply.json?["duplicate"] as? Bool == false)
        let serverTime = try #require(reply.json?["serverTime"] as? Int)

        let (seq, event) = try bob.nextEvent()
        #expect(event == .message(DeliveredMessage(
            messageID: "welcome-1", sender: "billing", senderDevice: "admin", recipient: "bob",
            contentType: "text/plain; charset=utf-8", body: Array("Welcome!".utf8), serverTime: UInt64(serverTime))))
        try bob.ack(seq)

        let again = try http(server, "POST", "/v1/messages", json: #"{"to":"bob","messageId":"welcome-1","body":"Welcome!","from":"billing"}"#)
        #expect(again.status == 200)
        #expect(again.json?["duplicate"] as? Bool == true)
        #expect(again.json?["serverTime"] as? Int == serverTime)
        #expect(try bob.staysSilent(for: .milliseconds(50)), "a duplicate was delivered again")

        let binary = try http(server, "POST", "/v1/messages", json: #"{"to":"bob","messageId":"b-1","bodyBase64":"AAEC/w==","contentType":"application/x-test"}"#)
        #expect(binary.status == 200)
        guard case .message(let delivered) = try bob.nextEvent().event else { Issue.record("no message"); return }
        #expect(delivered.body == [0, 1, 2, 255])
        #expect(delivered.sender == "system")
    }

    @Test("POST /v1/messages whose commit misses the store timeout is refused with 503 and never delivered")
    func systemMessageStoreTimeout() throws {
        let store = ModelEventStore()
        let server = try TestServer(store: store) {
            $0.admin = AdminConfiguration(host: "127.0.0.1", port: 0)
            $0.storeTimeout = .seconds(5)
            $0.delivery = .afterCommit
        }
        let (bob, _) = try server.connect(user: "bob")
        try server.waitFor("bob's device to be stored") { _ in (try? store.loadSnapshot().devices.count) == 1 }
        store.closeGate()
        defer { store.openGate() }
        let answer = Mutex<HTTPReply?>(nil)
        let port = server.server.adminPort!
        let sender = JoinableThread {
            let reply = try? HTTPRequest.send("POST", port: port, "/v1/messages", body: Array(#"{"to":"bob","messageId":"late","body":"x"}"#.utf8))
            answer.withLock { $0 = reply }
        }
        try server.waitFor("the commit to hang") { _ in store.appliesWaitingAtGate == 1 }
        try server.advance(by: .milliseconds(5_200))
        sender.join()
        let reply = try #require(answer.withLock { $0 })
        #expect(reply.status == 503)
        #expect(reply.json?["error"] as? String == "storeUnavailable")
        #expect(try bob.staysSilent(for: .milliseconds(50)))
    }

    @Test("POST /v1/messages with bad input gets a 4xx JSON error and changes nothing")
    func badMessages() throws {
        let server = try adminServer()
        let (bob, _) = try server.connect(user: "bob")
        let cases: [(json: String, status: Int, error: String)] = [
            ("{not json", 400, "badJSON"),
            ("[1,2]", 400, "badRequest"),
            (#"{"messageId":"m","body":"x"}"#, 400, "badRequest"),
            (#"{"to":"bob","body":"x"}"#, 400, "badRequest"),
            (#"{"to":"bob","messageId":"m"}"#, 400, "badRequest"),
            (#"{"to":"bob","messageId":"m","body":"x","bodyBase64":"eA=="}"#, 400, "badRequest"),
            (#"{"to":"bob","messageId":"m","bodyBase64":"%%%"}"#, 400, "badRequest"),
            (#"{"to":"bob","messageId":"m","body":7}"#, 400, "badRequest"),
            (#"{"to":"","messageId":"m","body":"x"}"#, 400, "badRequest"),
            (#"{"to":"bob","messageId":"m","body":"x","priority":"high"}"#, 400, "badRequest"),
            ("{\"to\":\"bob\",\"messageId\":\"\(String(repeating: "m", count: 129))\",\"body\":\"x\"}", 400, "badRequest"),
            ("{\"to\":\"bob\",\"messageId\":\"big\",\"body\":\"\(String(repeating: "x", count: 70_000))\"}", 413, "bodyTooLarge"),
            (#"{"to":"nobody","messageId":"m","body":"x"}"#, 404, "unknownUser"),
        ]
        for (json, status, error) in cases {
            let reply = try http(server, "POST", "/v1/messages", json: json)
            #expect(reply.status == status, "\(json.prefix(80))")
            #expect(reply.json?["error"] as? String == error, "\(json.prefix(80))")
            #expect(reply.json?["message"] is String)
        }
        #expect(try bob.staysSilent(for: .milliseconds(50)))
        #expect(server.server.statistics.messagesAccepted == 0)
        // The id refused above was not remembered: the same id is accepted now.
        #expect(try http(server, "POST", "/v1/messages", json: #"{"to":"bob","messageId":"m","body":"x"}"#).status == 200)
        #expect(try bob.nextEvent().seq == 1)
    }

    @Test("POST /v1/messages refused by a limit gets 429 with the protocol's error code")
    func refusedMessage() throws {
        let server = try TestServer(store: nil) {
            $0.admin = AdminConfiguration(host: "127.0.0.1", port: 0)
            $0.maxPendingEvents = 1
        }
        _ = try server.connect(user: "bob")
        #expect(try http(server, "POST", "/v1/messages", json: #"{"to":"bob","messageId":"m1","body":"x"}"#).status == 200)
        let full = try http(server, "POST", "/v1/messages", json: #"{"to":"bob","messageId":"m2","body":"x"}"#)
        #expect(full.status == 429)
        #expect(full.json?["error"] as? String == "recipientBacklogFull")
        #expect(full.json?["code"] as? Int == 300)
    }

    // MARK: Users and devices

    @Test("GET /v1/users/{id}/devices lists online and offline devices with last-seen times")
    func presence() throws {
        let server = try adminServer()
        let (phone, _) = try server.connect(user: "bob", device: "phone")
        do {
            let (tablet, _) = try server.connect(user: "bob", device: "tablet")
            _ = tablet
        }
        try server.waitFor("the tablet to disconnect") { $0.establishedConnections == 1 }
        let leftAt = server.clock.wallMilliseconds()
        try server.advance(by: .seconds(90))
        _ = phone

        let reply = try http(server, "GET", "/v1/users/bob/devices")
        #expect(reply.status == 200)
        #expect(reply.json?["user"] as? String == "bob")
        let devices = try #require(reply.json?["devices"] as? [[String: Any]])
        let byID = Dictionary(uniqueKeysWithValues: devices.map { ($0["device"] as! String, $0) })
        #expect(Set(byID.keys) == ["phone", "tablet"])
        #expect(byID["phone"]?["online"] as? Bool == true)
        #expect(byID["phone"]?["lastSeen"] as? Int == Int(server.clock.wallMilliseconds()))
        #expect(byID["tablet"]?["online"] as? Bool == false)
        let tabletSeen = try #require(byID["tablet"]?["lastSeen"] as? Int)
        #expect(abs(tabletSeen - Int(leftAt)) <= 1_000)

        let unknown = try http(server, "GET", "/v1/users/nobody/devices")
        #expect(unknown.status == 404)
        #expect(unknown.json?["error"] as? String == "unknownUser")
        // Ids are percent-encoded path segments.
        _ = try server.connect(user: "a b/c", device: "x")
        let encoded = try http(server, "GET", "/v1/users/a%20b%2Fc/devices")
        #expect(encoded.status == 200)
        #expect(encoded.json?["user"] as? String == "a b/c")
        #expect(try http(server, "GET", "/v1/users/\(String(repeating: "u", count: 129))/devices").status == 400)
    }

    @Test("DELETE /v1/users/{id}/devices/{device} closes the device and revokes its session; its events wait for the new one")
    func revokeDevice() throws {
        let server = try adminServer(store: ModelEventStore())
        let (alice, _) = try server.connect(user: "alice")
        let (phone, welcome) = try server.connect(user: "bob", device: "phone")
        let (tablet, _) = try server.connect(user: "bob", device: "tablet")
        #expect(try alice.request(1, message("m1", to: "bob")).isOK)
        _ = try phone.nextEvent()  // written, not acknowledged

        let reply = try http(server, "DELETE", "/v1/users/bob/devices/phone")
        #expect(reply.status == 200)
        #expect(reply.json?["disconnected"] as? Bool == true)
        let close = try phone.expectClose()
        #expect(close.code == .sessionUnknown)
        #expect(close.action == .fresh)
        // Bob's other device is untouched: still connected, it reads its copy.
        guard case .message(let copy) = try tablet.nextEvent().event else { Issue.record("no message on the tablet"); return }
        #expect(copy.messageID == "m1")

        // The old session cannot be resumed; a new one gets the pending message.
        let resumer = try server.client()
        #expect(throws: TestClient.Failure.self) {
            try resumer.hello(user: "bob", device: "phone", resume: ResumePoint(sessionID: welcome.sessionID, lastReceivedSeq: 0))
        }
        let fresh = try server.client()
        let renewed = try fresh.hello(user: "bob", device: "phone")
        #expect(renewed.sessionID != welcome.sessionID)
        #expect(!renewed.resumed)
        guard case .message(let again) = try fresh.nextEvent().event else { Issue.record("no message"); return }
        #expect(again.messageID == "m1")

        #expect(try http(server, "DELETE", "/v1/users/bob/devices/laptop").json?["error"] as? String == "unknownDevice")
        #expect(try http(server, "DELETE", "/v1/users/nobody/devices/phone").json?["error"] as? String == "unknownUser")
        #expect(try http(server, "DELETE", "/v1/users/nobody/devices/phone").status == 404)
    }

    @Test("DELETE /v1/users/{id} closes every device and forgets the user and its stored events, also across a restart")
    func forgetUser() throws {
        let store = ModelEventStore()
        let clock = ManualClock()
        do {
            let server = try TestServer(store: store, clock: clock) { $0.admin = AdminConfiguration(host: "127.0.0.1", port: 0) }
            let (alice, _) = try server.connect(user: "alice")
            let (phone, _) = try server.connect(user: "bob", device: "phone")
            do { _ = try server.connect(user: "bob", device: "tablet") }  // offline, its events stored
            #expect(try alice.request(1, message("m1", to: "bob")).isOK)
            #expect(try alice.request(2, message("m2", to: "carol")).isOK)  // held for carol

            let reply = try http(server, "DELETE", "/v1/users/bob")
            #expect(reply.status == 200)
            #expect(reply.json?["devicesRemoved"] as? Int == 2)
            #expect(try phone.expectClose().code == .sessionUnknown)
            #expect(try http(server, "GET", "/v1/users/bob/devices").status == 404)
            #expect(try http(server, "DELETE", "/v1/users/bob").status == 404)
            // A user known only by held messages can be forgotten too.
            #expect(try http(server, "DELETE", "/v1/users/carol").status == 200)
            try server.waitFor("the removal to be committed") { _ in
                (try? store.loadSnapshot()).map { $0.devices.allSatisfy { $0.userID != "bob" } && $0.held["carol"] == nil } == true
            }
            // bob comes back as a new user with nothing waiting.
            let (returning, welcome) = try server.connect(user: "bob", device: "phone")
            #expect(welcome.lastSeq == 0)
            #expect(try returning.staysSilent(for: .milliseconds(50)))
        }
        let restarted = try TestServer(store: store, clock: clock) { $0.admin = AdminConfiguration(host: "127.0.0.1", port: 0) }
        let devices = try http(restarted, "GET", "/v1/users/bob/devices")
        #expect((devices.json?["devices"] as? [[String: Any]])?.map { $0["device"] as? String } == ["phone"])
        #expect((devices.json?["devices"] as? [[String: Any]])?.first?["pendingEvents"] as? Int == 0)
    }

    /// alice (of routing shard `callerShard` of two) calls bob (of shard 1), whose phone rings,
    /// connected. The manual clock stands still from here: neither a grace period nor the
    /// ring timeout can end the call, so an ending the tests read came at once.
    func ringingCall(_ server: TestServer, callerShard: Int) throws -> (caller: TestClient, phone: TestClient, alice: String, bob: String) {
        let alice = TwoShards.user("alice", onShard: callerShard), bob = TwoShards.user("bob", onShard: 1)
        let (caller, _) = try server.connect(user: alice)
        let (phone, _) = try server.connect(user: bob, device: "phone")
        #expect(try caller.request(1, .callInvite(callID: "c1", callee: bob, offer: [1])).isOK)
        guard case .callIncoming("c1", alice, "d1", _, _) = try phone.nextEvent().event else {
            throw TestClient.Failure("bob's phone did not ring")
        }
        return (caller, phone, alice, bob)
    }

    @Test("DELETE /v1/users/{id} of a callee whose device rings, connected: the caller hears CALL_ENDED peerDisconnected at once (caller on the other shard, then the same)", arguments: [0, 1])
    func forgetRingingCallee(callerShard: Int) throws {
        let server = try adminServer()
        let (caller, phone, _, bob) = try ringingCall(server, callerShard: callerShard)
        #expect(try http(server, "DELETE", "/v1/users/\(bob)").status == 200)
        #expect(try phone.expectClose().code == .sessionUnknown)
        guard case .callEnded("c1", .peerDisconnected, bob, _) = try caller.nextEvent().event else {
            Issue.record("the caller was not told the callee is gone"); return
        }
        #expect(try caller.request(2, .callCancel(callID: "c1")).errorCode == .unknownCall, "the call is still live")
    }

    @Test("DELETE /v1/users/{id} of a caller whose call rings: the callee's ringing device hears CALL_ENDED peerDisconnected at once (caller on the other shard, then the same)", arguments: [0, 1])
    func forgetRingingCaller(callerShard: Int) throws {
        let server = try adminServer()
        let (caller, phone, alice, _) = try ringingCall(server, callerShard: callerShard)
        #expect(try http(server, "DELETE", "/v1/users/\(alice)").status == 200)
        #expect(try caller.expectClose().code == .sessionUnknown)
        guard case .callEnded("c1", .peerDisconnected, alice, _) = try phone.nextEvent().event else {
            Issue.record("the callee was not told the caller is gone"); return
        }
        #expect(try phone.request(1, .callAccept(callID: "c1", answer: [2])).errorCode == .unknownCall, "the call is still live")
    }

    @Test("DELETE /v1/users/{id}/devices/{device} of a ringing device: the call goes on through the device's grace, as after a lost connection; a new session rings and answers")
    func revokeRingingDevice() throws {
        let server = try adminServer()
        let (caller, phone, alice, bob) = try ringingCall(server, callerShard: 0)
        #expect(try http(server, "DELETE", "/v1/users/\(bob)/devices/phone").status == 200)
        #expect(try phone.expectClose().code == .sessionUnknown)
        try server.waitFor("the phone's disconnect") { $0.establishedConnections == 1 }
        #expect(try caller.staysSilent(for: .milliseconds(50)))
        let fresh = try server.client()
        _ = try fresh.hello(user: bob, device: "phone")
        guard case .callIncoming("c1", alice, "d1", _, _) = try fresh.nextEvent().event else {
            Issue.record("the new session was not rung"); return
        }
        #expect(try fresh.request(1, .callAccept(callID: "c1", answer: [2])).isOK)
        #expect(try caller.nextEvent().event == .callAccepted(callID: "c1", device: "phone", answer: [2]))
    }

    @Test("DELETE /v1/users/{id}/devices/{device} of a call's answering device: a new session within its grace stays the answering device, past the grace too")
    func revokeAnsweringDevice() throws {
        let server = try adminServer()
        let (caller, phone, alice, bob) = try ringingCall(server, callerShard: 0)
        #expect(try phone.request(1, .callAccept(callID: "c1", answer: [2])).isOK)
        #expect(try caller.nextEvent().event == .callAccepted(callID: "c1", device: "phone", answer: [2]))
        #expect(try http(server, "DELETE", "/v1/users/\(bob)/devices/phone").status == 200)
        #expect(try phone.expectClose().code == .sessionUnknown)
        try server.waitFor("the phone's disconnect") { $0.establishedConnections == 1 }
        let fresh = try server.client()
        _ = try fresh.hello(user: bob, device: "phone")
        try server.advance(by: .seconds(11))
        #expect(try caller.staysSilent(for: .milliseconds(50)), "the grace check ended the call")
        #expect(try caller.request(2, .callHangup(callID: "c1")).isOK)
        var ended: Event?
        while ended == nil {
            let event = try fresh.nextEvent().event
            if case .callEnded = event { ended = event }
        }
        guard case .callEnded("c1", .hungUp, alice, _)? = ended else { Issue.record("the new session was not told of the hang-up"); return }
    }

    @Test("DELETE /v1/users/{id}/devices/{device} of a ringing device that stays away: the caller hears peerDisconnected when its grace ends")
    func revokeRingingDeviceStaysAway() throws {
        let server = try adminServer()
        let (caller, phone, _, bob) = try ringingCall(server, callerShard: 0)
        #expect(try http(server, "DELETE", "/v1/users/\(bob)/devices/phone").status == 200)
        #expect(try phone.expectClose().code == .sessionUnknown)
        try server.waitFor("the phone's disconnect") { $0.establishedConnections == 1 }
        try server.advance(by: .seconds(9))
        #expect(try caller.staysSilent(for: .milliseconds(20)))
        try server.advance(by: .seconds(2))
        guard case .callEnded("c1", .peerDisconnected, bob, _) = try caller.nextEvent().event else {
            Issue.record("the caller was not told when the grace ended"); return
        }
    }

    // MARK: Multi-device sync

    @Test("a message a user sends reaches the user's other devices too, and only the recipient's acknowledgements are receipts")
    func multiDeviceSync() throws {
        let server = try adminServer()
        let (phone, _) = try server.connect(user: "alice", device: "phone")
        let (laptop, _) = try server.connect(user: "alice", device: "laptop")
        let (bob, _) = try server.connect(user: "bob")
        #expect(try phone.request(1, message("m1", to: "bob", "hi bob")).isOK)

        let copy = try laptop.nextEvent()
        guard case .message(let synced) = copy.event else { Issue.record("no copy on the laptop"); return }
        #expect(synced.sender == "alice")
        #expect(synced.senderDevice == "phone")
        #expect(synced.recipient == "bob")
        #expect(synced.body == Array("hi bob".utf8))
        #expect(try phone.staysSilent(for: .milliseconds(30)), "the sending device got its own message")

        // The laptop's acknowledgement is no delivery; bob's is, on both of alice's devices.
        try laptop.ack(copy.seq)
        #expect(try phone.staysSilent(for: .milliseconds(50)))
        let delivered = try bob.nextEvent()
        try bob.ack(delivered.seq)
        for device in [phone, laptop] {
            guard case .messageDelivered("m1", "bob", "d1", _) = try device.nextEvent().event else {
                Issue.record("no delivery receipt"); return
            }
        }
        #expect(try laptop.staysSilent(for: .milliseconds(30)))
    }

    // MARK: Metrics

    @Test("/metrics is valid Prometheus text (parsed by prometheus_client) and counts what happened")
    func metricsParse() throws {
        let store = ModelEventStore()
        let server = try adminServer(store: store, token: Self.token)
        let (alice, _) = try server.connect(user: "alice")
        let (bob, _) = try server.connect(user: "bob")
        for index in 1...5 { #expect(try alice.request(UInt32(index), message("m\(index)", to: "bob")).isOK) }
        for _ in 1...5 { try bob.ack(try bob.nextEvent().seq) }
        for _ in 1...5 { _ = try alice.nextEvent() }  // receipts
        let refused = try server.client()
        #expect(throws: TestClient.Failure.self) { try refused.hello(user: "x", device: "y", keepAlive: 30) }

        let reply = try http(server, "GET", "/metrics", token: Self.token)
        #expect(reply.status == 200)
        #expect(reply.headers["content-type"]?.hasPrefix("text/plain; version=0.0.4") == true)
        let families = try PrometheusParser.parse(reply.text)

        func value(_ family: String, _ sample: String, _ labels: [String: String] = [:]) -> Double? {
            families[family]?.samples.first { $0.name == sample && $0.labels == labels }?.value
        }
        #expect(families["voipserver_build_info"]?.type == "gauge")
        #expect(value("voipserver_build_info", "voipserver_build_info", ["version": ProductVersion.current, "protocol": "1"]) == 1)
        #expect(families["voipserver_handshakes"]?.type == "counter")
        #expect(value("voipserver_handshakes", "voipserver_handshakes_total", ["result": "completed"]) == 2)
        #expect(value("voipserver_handshakes", "voipserver_handshakes_total", ["result": "keepAliveTooShort"]) == 1)
        #expect(value("voipserver_connections", "voipserver_connections", ["state": "established", "transport": "plain"]) == 2)
        #expect(value("voipserver_requests", "voipserver_requests_total", ["kind": "messageSend"]) == 5)
        #expect(value("voipserver_events_written", "voipserver_events_written_total", ["kind": "message"]) == 5)
        #expect(value("voipserver_events_written", "voipserver_events_written_total", ["kind": "messageDelivered"]) == 5)
        #expect(value("voipserver_messages", "voipserver_messages_total", ["result": "accepted"]) == 5)
        #expect(value("voipserver_pending_events", "voipserver_pending_events") == 5)  // the receipts, not acknowledged
        #expect(value("voipserver_store_healthy", "voipserver_store_healthy") == 1)
        #expect(value("voipserver_ready", "voipserver_ready") == 1)
        for name in ["voipserver_refusals", "voipserver_events_dropped", "voipserver_slow_consumers"] {
            #expect(families[name]?.type == "counter", "\(name)")
        }

        for histogram in ["voipserver_push_latency_seconds", "voipserver_store_commit_seconds", "voipserver_routing_lock_hold_seconds"] {
            let family = try #require(families[histogram], "\(histogram)")
            #expect(family.type == "histogram")
            let buckets = family.samples.filter { $0.name == histogram + "_bucket" }
            #expect(buckets.last?.labels["le"] == "+Inf")
            #expect(zip(buckets, buckets.dropFirst()).allSatisfy { $0.value <= $1.value }, "buckets must be cumulative")
            let count = try #require(family.samples.first { $0.name == histogram + "_count" }?.value)
            #expect(buckets.last?.value == count)
            #expect(count >= 1)
            #expect((family.samples.first { $0.name == histogram + "_sum" }?.value ?? -1) >= 0)
        }
        // Every request, ACK and write batch held the routing lock at least once.
        let holds = try #require(value("voipserver_routing_lock_hold_seconds", "voipserver_routing_lock_hold_seconds_count"))
        #expect(holds >= 12)  // 2 handshakes, 5 sends, 5 ACKs, and more
        let longest = try #require(value("voipserver_routing_lock_hold_max_seconds", "voipserver_routing_lock_hold_max_seconds"))
        #expect(longest > 0 && longest < 1, "the longest hold is a positive number of seconds")
        // Ten events written (5 messages, 5 receipts), each measured once.
        #expect(families["voipserver_push_latency_seconds"]?.samples.first { $0.name == "voipserver_push_latency_seconds_count" }?.value == 10)
    }
    @Test("/metrics has a hold histogram and a longest hold for every shared lock, and the routing holds of the paths that ran grow; running loops take no lock for their shards or their callbacks")
    func lockHoldFamily() throws {
        let server = try adminServer(store: ModelEventStore())
        func shardHolds(_ families: [String: PrometheusParser.Family]) -> Double? {
            families["voipserver_routing_lock_hold_seconds"]?.samples.first { $0.name == "voipserver_routing_lock_hold_seconds_count" }?.value
        }
        func scrape() throws -> [String: PrometheusParser.Family] {
            try PrometheusParser.parse(try http(server, "GET", "/metrics").text)
        }
        func holds(_ families: [String: PrometheusParser.Family], _ lock: String) -> Double? {
            families["voipserver_lock_hold_seconds"]?.samples.first {
                $0.name == "voipserver_lock_hold_seconds_count" && $0.labels == ["lock": lock]
            }?.value
        }
        let before = try scrape()
        let fallbackBefore = server.server.routingShardLockHolds
        // Handshakes, messages with a store (routing, their commits' release posted to a
        // loop's inbox), ACKs and receipts, and a call.
        let (alice, _) = try server.connect(user: "alice")
        let (bob, _) = try server.connect(user: "bob")
        for index in 1...3 { #expect(try alice.request(UInt32(index), message("m\(index)", to: "bob")).isOK) }
        for _ in 1...3 { try bob.ack(try bob.nextEvent().seq) }
        for _ in 1...3 { _ = try alice.nextEvent() }  // receipts
        #expect(try alice.request(9, .callInvite(callID: "c1", callee: "bob", offer: Array("v=0".utf8))).isOK)
        let after = try scrape()

        let family = try #require(after["voipserver_lock_hold_seconds"])
        #expect(family.type == "histogram")
        let labels = ["routing_shard", "loop_ownership",
                      "call_directory", "log_throttle",
                      "relay_directory", "front_route"]
        for lock in labels {
            let buckets = family.samples.filter { $0.name == "voipserver_lock_hold_seconds_bucket" && $0.labels["lock"] == lock }
            #expect(buckets.count == 20, "\(lock): 19 bounds and +Inf")
            #expect(buckets.last?.labels["le"] == "+Inf")
            #expect(buckets.last?.value == holds(after, lock), "\(lock)")
            let longest = after["voipserver_lock_hold_max_seconds"]?.samples.first { $0.labels == ["lock": lock] }
            #expect(longest != nil, "\(lock) has a longest hold")
        }
        #expect(Set(family.samples.compactMap { $0.labels["lock"] }) == Set(labels))
        // (`call_directory` is the call directory's overflow, which a short call id never
        // takes: "Call directory" suite.)
        // Every hold of a shard is timed, but the loops own their shards and take no lock:
        // this server's fallback locks (`routing_shard`) were not taken meanwhile (the
        // scrape's reads of the counters are handed to the owners too). Nor do a running
        // loop's callbacks take its `loop_ownership` (no loop recorded a hold of it; the
        // process-wide count has other tests' loops driven by their threads).
        #expect((shardHolds(after) ?? 0) - (shardHolds(before) ?? 0) >= 10)
        #expect(server.server.routingShardLockHolds == fallbackBefore)
        #expect(server.server.eventLoops.allSatisfy { $0.metrics.lockHolds.snapshot(.loopOwnership).count == 0 })
        let longestOwnership = after["voipserver_lock_hold_max_seconds"]?.samples.first { $0.labels == ["lock": "loop_ownership"] }?.value
        #expect((longestOwnership ?? 1) < 1)
    }

    @Test("/metrics counts refused handshakes by their CLOSE code, credentials refusals included")
    func refusedHandshakesByCode() throws {
        let key = try TokenKey(id: "k1", secret: Array("admin-metrics-secret-0123456789abcdef".utf8))
        let server = try TestServer { $0.authKeys = [key]; $0.admin = AdminConfiguration(host: "127.0.0.1", port: 0) }
        for credentials in [nil, Array("not-a-token".utf8)] {
            let client = try server.client()
            #expect(throws: TestClient.Failure.self) { try client.hello(user: "alice", credentials: credentials) }
        }
        let families = try PrometheusParser.parse(try http(server, "GET", "/metrics").text)
        let refused = families["voipserver_handshakes"]?.samples.first { $0.labels == ["result": "unauthorized"] }?.value
        #expect(refused == 2)
    }

    @Test("an event that waited for its device to connect is no push latency sample; one written at once is")
    func pushLatencyLeavesOutWaitingEvents() throws {
        let server = try adminServer()
        let (alice, _) = try server.connect(user: "alice")
        do { _ = try server.connect(user: "bob") }  // known, then offline
        try server.waitFor("bob to disconnect") { $0.establishedConnections == 1 }
        for index in 1...3 { #expect(try alice.request(UInt32(index), message("m\(index)", to: "bob")).isOK) }
        #expect(try alice.request(9, message("held", to: "carol")).isOK)  // no device at all
        let (bob, _) = try server.connect(user: "bob")
        for _ in 1...3 { _ = try bob.nextEvent() }
        let (carol, _) = try server.connect(user: "carol")
        _ = try carol.nextEvent()
        #expect(try alice.request(10, message("live", to: "bob")).isOK)
        _ = try bob.nextEvent()

        let families = try PrometheusParser.parse(try http(server, "GET", "/metrics").text)
        let samples = try #require(families["voipserver_push_latency_seconds"]?.samples)
        #expect(families["voipserver_events_written"]?.samples.first { $0.labels["kind"] == "message" }?.value == 5)
        #expect(samples.first { $0.name == "voipserver_push_latency_seconds_count" }?.value == 1)
    }
}

/// Parses Prometheus text with the reference parser (Debian python3-prometheus-client,
/// `prometheus_client.parser.text_string_to_metric_families`) in a subprocess.
enum PrometheusParser {
    struct Sample: Equatable {
        var name: String
        var labels: [String: String]
        var value: Double
    }

    struct Family {
        var type: String
        var samples: [Sample]
    }

    struct Failure: Error, CustomStringConvertible {
        let description: String
    }

    static let script = """
        import json, sys
        from prometheus_client.parser import text_string_to_metric_families
        families = {}
        for family in text_string_to_metric_families(open(sys.argv[1]).read()):
            families[family.name] = {"type": family.type, "samples": [[s.name, s.labels, s.value] for s in family.samples]}
        print(json.dumps(families))
        """

    static func parse(_ text: String) throws -> [String: Family] {
        let directory = try TemporaryDirectory("prometheus")
        try text.write(toFile: directory.file("metrics.txt"), atomically: true, encoding: .utf8)
        try script.write(toFile: directory.file("parse.py"), atomically: true, encoding: .utf8)
        let process = try ChildProcess.spawn(
            "/usr/bin/python3", arguments: [directory.file("parse.py"), directory.file("metrics.txt")], pipeInput: false,
            stdout: .file(directory.file("out.json")), stderr: .file(directory.file("err.txt")))
        guard let status = process.waitForExit(timeoutSeconds: 60), status == 0 else {
            let error = (try? String(contentsOfFile: directory.file("err.txt"), encoding: .utf8)) ?? ""
            throw Failure(description: "prometheus_client rejected the text (is python3-prometheus-client installed? Tools/ensure-deps): \(error)\n\(text)")
        }
        let data = try Data(contentsOf: URL(fileURLWithPath: directory.file("out.json")))
        guard let object = try JSONSerialization.jsonObject(with: data) as? [String: [String: Any]] else {
            throw Failure(description: "unexpected parser output")
        }
        return object.mapValues { family in
            Family(
                type: family["type"] as? String ?? "",
                samples: (family["samples"] as? [[Any]] ?? []).map { sample in
                    Sample(
                        name: sample[0] as? String ?? "", labels: sample[1] as? [String: String] ?? [:],
                        value: (sample[2] as? NSNumber)?.doubleValue ?? .nan)
                })
        }
    }
}
