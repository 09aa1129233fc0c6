import Foundation
import SignalingCrypto
import SignalingPush
import SignalingStore
import SignalingSupport
import Synchronization
import TestSupport
import Testing

/// A gateway that speaks to APNs and FCM, both played by Tools/mock-push-service.py over
/// real HTTP/2 with TLS under a test CA, on a manual clock.
final class ProviderHarness {
    let pki: PushTestPKI
    let mock: MockPushService
    let clock = ManualClock()
    let gateway: PushGateway
    /// What the gateway reported as invalid tokens: (wake-up, registration, reason).
    final class Reports: Sendable {
        let list = Mutex<[(WakeUp, PushRegistration, String)]>([])
        func withLock<T>(_ body: ([(WakeUp, PushRegistration, String)]) -> T) -> T { list.withLock { body($0) } }
    }
    let invalidated = Reports()

    init(_ configure: (inout PushGatewayConfiguration) -> Void = { _ in }) throws {
        pki = try PushTestPKI()
        mock = try MockPushService(pki: pki)
        try pki.writeServiceAccount(tokenURI: mock.baseURL + "/token")
        var configuration = PushGatewayConfiguration()
        var apns = APNsConfiguration(
            key: try JWTSigningKey(pem: String(contentsOfFile: pki.apnsKeyFile, encoding: .utf8)),
            keyID: PushTestPKI.apnsKeyID, teamID: PushTestPKI.apnsTeamID, defaultTopic: "com.example.voip")
        apns.productionURL = mock.baseURL
        apns.sandboxURL = mock.baseURL
        configuration.apns = apns
        var fcm = FCMConfiguration(account: try FCMConfiguration.ServiceAccount(json: Array(try Data(contentsOf: URL(fileURLWithPath: pki.serviceAccountFile)))))
        fcm.messagesURL = mock.baseURL
        configuration.fcm = fcm
        configuration.caFile = pki.caFile
        configuration.tickInterval = .milliseconds(2)
        configuration.minimumBackoff = .seconds(1)
        configuration.maximumBackoff = .seconds(1)
        configuration.minimumInterval = .zero
        configuration.requestTimeout = .seconds(10)
        configure(&configuration)
        gateway = try PushGateway(configuration: configuration, clock: clock, logger: .silent)
        gateway.onTokenInvalid { [invalidated] wakeUp, registration, reason in
            invalidated.list.withLock { $0.append((wakeUp, registration, reason)) }
        }
        try gateway.start()
    }

    deinit {
        gateway.stop()
        mock.stop()
    }

    func advance(by duration: Duration) throws {
        clock.advance(by: duration)
        guard gateway.awaitTicks(2) else { throw TestFailure("the gateway did not tick") }
    }

    func waitFor(_ what: String, _ condition: (PushStatistics) -> Bool) throws {
        let deadline = SystemClock().now() + .seconds(20)
        while !condition(gateway.statistics) {
            guard SystemClock().now() < deadline else { throw TestFailure("timed out waiting for \(what); \(gateway.statistics)") }
            _ = gateway.awaitTicks(1, timeout: .milliseconds(100))
        }
    }
}

let voipToken: [UInt8] = [0xAB, 0xCD, 0x01, 0x02] + [UInt8](repeating: 0x11, count: 28)
let alertToken: [UInt8] = [0x12, 0x34] + [UInt8](repeating: 0x22, count: 30)
let fcmToken = Array("fcm-registration-token:APA91b-example".utf8)

func hex(_ bytes: [UInt8]) -> String { bytes.map { String(format: "%02x", $0) }.joined() }

func iPhone(_ kind: WakeUpKind, device: String = "iphone", conversation: String? = nil, pending: Int = 1) -> WakeUp {
    WakeUp(
        userID: "bob", deviceID: device,
        registrations: [
            PushRegistration(platform: "apns-voip", token: voipToken, environment: "sandbox", topic: "com.example.app"),
            PushRegistration(platform: "apns", token: alertToken),
        ],
        kind: kind, pendingEvents: pending, conversation: conversation)
}

func android(_ kind: WakeUpKind, device: String = "pixel", conversation: String? = nil) -> WakeUp {
    WakeUp(userID: "carol", deviceID: device, registrations: [PushRegistration(platform: "fcm", token: fcmToken)],
           kind: kind, pendingEvents: 2, conversation: conversation)
}

@Suite("APNs and FCM providers against a local HTTP/2 mock", .serialized)
struct ProviderTests {
    @Test("a call to an iPhone is a VoIP push: <topic>.voip, priority 10, expiring with the ring, an ES256 token the team's key verifies")
    func callIsVoIPPush() throws {
        let harness = try ProviderHarness()
        harness.gateway.submit(iPhone(.call))
        let request = try #require(try harness.mock.waitFor("the VoIP push") { $0.count == 1 }.first)
        #expect(request.path == "/3/device/" + hex(voipToken))
        #expect(request.headers["apns-topic"] == "com.example.app.voip")
        #expect(request.headers["apns-push-type"] == "voip")
        #expect(request.headers["apns-priority"] == "10")
        #expect(request.headers["apns-expiration"] == String(harness.clock.wallMilliseconds() / 1000 + 60))
        #expect(request.headers["apns-collapse-id"] == nil)
        #expect(request.auth == "ok", "the mock verifies the signature with the key's public half")
        #expect(request.jwtHeader["alg"] as? String == "ES256" && request.jwtHeader["kid"] as? String == PushTestPKI.apnsKeyID)
        #expect(request.jwtClaims["iss"] as? String == PushTestPKI.apnsTeamID)
        #expect(request.jwtClaims["iat"] as? Int == Int(harness.clock.wallMilliseconds() / 1000))
        let vs = try #require(request.json["vs"] as? [String: Any])
        #expect(vs["kind"] as? String == "call" && vs["user"] as? String == "bob" && vs["device"] as? String == "iphone")
        #expect(request.json["aps"] == nil)
        try harness.waitFor("the push to count as sent") { $0.sent == 1 }
    }

    @Test("a message is an alert with mutable-content on the alert token, one collapse id per conversation, and no text")
    func messageIsAlert() throws {
        let harness = try ProviderHarness()
        harness.gateway.submit(iPhone(.message, device: "a", conversation: "alice"))
        harness.gateway.submit(iPhone(.message, device: "b", conversation: "alice"))
        harness.gateway.submit(iPhone(.message, device: "c", conversation: "dave"))
        let requests = try harness.mock.waitFor("three alerts") { $0.count == 3 }
        for request in requests {
            #expect(request.path == "/3/device/" + hex(alertToken))
            #expect(request.headers["apns-topic"] == "com.example.voip")
            #expect(request.headers["apns-push-type"] == "alert")
            #expect(request.headers["apns-priority"] == "10")
            #expect(request.headers["apns-expiration"] == nil)
            let aps = try #require(request.json["aps"] as? [String: Any])
            #expect(aps["mutable-content"] as? Int == 1)
            #expect((aps["alert"] as? [String: Any])?["loc-key"] as? String == "VS_MESSAGE")
        }
        let byDevice = Dictionary(uniqueKeysWithValues: requests.map { (($0.json["vs"] as? [String: Any])?["device"] as? String ?? "", $0) })
        let alice = try #require(byDevice["a"]?.headers["apns-collapse-id"])
        #expect(byDevice["b"]?.headers["apns-collapse-id"] == alice)
        #expect(byDevice["c"]?.headers["apns-collapse-id"] != alice)
        #expect(!alice.contains("alice"), "the collapse id is a hash: no user id reaches Apple")
    }

    @Test("a receipt is a background push at priority 5")
    func receiptIsBackground() throws {
        let harness = try ProviderHarness()
        harness.gateway.submit(iPhone(.receipt))
        let request = try #require(try harness.mock.waitFor("the background push") { $0.count == 1 }.first)
        #expect(request.headers["apns-push-type"] == "background")
        #expect(request.headers["apns-priority"] == "5")
        #expect((request.json["aps"] as? [String: Any])?["content-available"] as? Int == 1)
    }

    @Test("200 wake-ups travel as streams of one HTTP/2 connection")
    func oneConnection() throws {
        let harness = try ProviderHarness()
        for index in 0..<200 { harness.gateway.submit(iPhone(.message, device: "d\(index)")) }
        let requests = try harness.mock.waitFor("200 pushes") { $0.count == 200 }
        #expect(Set(requests.map(\.connection)).count == 1)
        #expect(harness.mock.connectionCount == 1)
        try harness.waitFor("every push sent") { $0.sent == 200 }
    }

    @Test("an invalid token (410 Unregistered, 400 BadDeviceToken) is reported for removal, counted, and not retried",
          arguments: [(410, "Unregistered"), (400, "BadDeviceToken")])
    func invalidToken(status: Int, reason: String) throws {
        let harness = try ProviderHarness()
        try harness.mock.script([["status": status, "reason": reason, "match": "/3/device"]])
        harness.gateway.submit(iPhone(.call))
        try harness.waitFor("the token to be removed") { $0.tokensRemoved == 1 }
        let invalidated = harness.invalidated.withLock { $0 }
        #expect(invalidated.count == 1)
        #expect(invalidated.first?.1.kind == .apnsVoIP && invalidated.first?.1.token == voipToken)
        #expect(invalidated.first?.2 == reason)
        #expect(harness.gateway.statistics.rejectionReasons["apns:\(reason)"] == 1)
        try harness.advance(by: .seconds(30))
        #expect(harness.mock.requests.count == 1, "an invalid token is never retried")
    }

    @Test("429 with Retry-After is retried no sooner than it says, then delivered")
    func tooManyRequests() throws {
        let harness = try ProviderHarness { $0.maximumBackoff = .seconds(60) }
        try harness.mock.script([["status": 429, "reason": "TooManyRequests", "headers": ["retry-after": "5"], "match": "/3/device"]])
        harness.gateway.submit(iPhone(.message))
        try harness.waitFor("the failed attempt") { $0.retried == 1 }
        try harness.advance(by: .milliseconds(4900))
        #expect(harness.mock.requests.count == 1, "Retry-After 5 holds the retry back")
        try harness.advance(by: .milliseconds(200))
        try harness.mock.waitFor("the retry") { $0.count == 2 }
        try harness.waitFor("the retry to be delivered") { $0.sent == 1 }
    }

    @Test("the provider token is reused, and replaced once the refresh interval (40 min) has passed")
    func providerTokenRefresh() throws {
        let harness = try ProviderHarness()
        harness.gateway.submit(iPhone(.message, device: "a"))
        try harness.mock.waitFor("the first push") { $0.count == 1 }
        try harness.advance(by: .seconds(30 * 60))
        harness.gateway.submit(iPhone(.message, device: "b"))
        try harness.mock.waitFor("the second push") { $0.count == 2 }
        try harness.advance(by: .seconds(11 * 60))
        harness.gateway.submit(iPhone(.message, device: "c"))
        let requests = try harness.mock.waitFor("the third push") { $0.count == 3 }
        let tokens = requests.map { $0.headers["authorization"] ?? "" }
        #expect(tokens[0] == tokens[1])
        #expect(tokens[2] != tokens[1])
        #expect(requests.allSatisfy { $0.auth == "ok" })
        #expect((requests[2].jwtClaims["iat"] as? Int ?? 0) - (requests[0].jwtClaims["iat"] as? Int ?? 0) == 41 * 60)
    }

    @Test("ExpiredProviderToken: a new token is signed and the push retried at once, but never within 20 minutes of the last")
    func expiredProviderToken() throws {
        let harness = try ProviderHarness()
        // A token 5 minutes old is not replaced (Apple would answer TooManyProviderTokenUpdates).
        harness.gateway.submit(iPhone(.message, device: "a"))
        try harness.mock.waitFor("the first push") { $0.count == 1 }
        try harness.advance(by: .seconds(5 * 60))
        try harness.mock.script([["status": 403, "reason": "ExpiredProviderToken", "match": "/3/device"]])
        harness.gateway.submit(iPhone(.message, device: "b"))
        try harness.waitFor("the refused attempt") { $0.retried == 1 }
        #expect(harness.mock.requests.count == 2)
        // 25 minutes old: replaced, and the push goes again at once with the new token.
        try harness.advance(by: .seconds(20 * 60))
        try harness.mock.waitFor("b's retry") { $0.count == 3 }
        try harness.mock.script([["status": 403, "reason": "ExpiredProviderToken", "match": "/3/device"]])
        harness.gateway.submit(iPhone(.message, device: "c"))
        let requests = try harness.mock.waitFor("c refused, then sent with a new token") { $0.count == 5 }
        #expect(requests[3].headers["authorization"] == requests[0].headers["authorization"])
        #expect(requests[4].headers["authorization"] != requests[3].headers["authorization"])
        #expect(requests[4].status == 200)
        try harness.waitFor("all three delivered") { $0.sent == 3 }
    }

    @Test("a message to an Android device: an access token for a signed assertion, then messages:send with it at normal priority")
    func fcmMessage() throws {
        let harness = try ProviderHarness()
        harness.gateway.submit(android(.message, conversation: "alice"))
        harness.gateway.submit(android(.message, device: "tablet"))
        let requests = try harness.mock.waitFor("the token request and two messages") { $0.count == 3 }
        let token = requests[0]
        #expect(token.path == "/token" && token.auth == "ok")
        #expect(token.jwtHeader["alg"] as? String == "RS256")
        #expect(token.jwtClaims["scope"] as? String == "https://www.googleapis.com/auth/firebase.messaging")
        #expect(token.jwtClaims["aud"] as? String == harness.mock.baseURL + "/token")
        #expect(token.jwtClaims["iss"] as? String == "push@\(PushTestPKI.fcmProject).iam.gserviceaccount.com")
        for send in requests.dropFirst() {
            #expect(send.path == "/v1/projects/\(PushTestPKI.fcmProject)/messages:send")
            #expect(send.auth == "ok", "the bearer token is the one the token endpoint issued")
            let message = try #require(send.json["message"] as? [String: Any])
            #expect(message["token"] as? String == String(decoding: fcmToken, as: UTF8.self))
            let androidConfig = try #require(message["android"] as? [String: Any])
            #expect(androidConfig["priority"] as? String == "normal")
            #expect(androidConfig["ttl"] == nil)
            let data = try #require(message["data"] as? [String: String])
            #expect(data["kind"] == "message" && data["user"] == "carol" && data["pending"] == "2")
        }
        #expect(requests.filter { $0.path == "/token" }.count == 1, "the access token is cached")
        try harness.waitFor("both sent") { $0.sent == 2 }
    }

    @Test("a call to an Android device is a high-priority FCM message whose ttl ends with the ring; a receipt is normal priority")
    func fcmCall() throws {
        let harness = try ProviderHarness()
        harness.gateway.submit(android(.call))
        harness.gateway.submit(android(.receipt, device: "tablet"))
        let sends = try harness.mock.waitFor("two messages") { $0.filter { $0.path.hasSuffix(":send") }.count == 2 }
            .filter { $0.path.hasSuffix(":send") }
        let byKind = Dictionary(uniqueKeysWithValues: sends.map { send -> (String, [String: Any]) in
            let message = send.json["message"] as? [String: Any] ?? [:]
            return ((message["data"] as? [String: String])?["kind"] ?? "", message["android"] as? [String: Any] ?? [:])
        })
        #expect(byKind["call"]?["priority"] as? String == "high")
        #expect(byKind["call"]?["ttl"] as? String == "60s")
        #expect(byKind["call"]?["collapse_key"] == nil)
        #expect(byKind["receipt"]?["priority"] as? String == "normal")
    }

    @Test("FCM UNREGISTERED removes the token; 503 is retried with back-off")
    func fcmErrors() throws {
        let harness = try ProviderHarness()
        try harness.mock.script([
            ["status": 404, "fcmError": "UNREGISTERED", "match": "/v1/"],
            ["status": 503, "fcmStatus": "UNAVAILABLE", "fcmError": "UNAVAILABLE", "match": "/v1/"],
        ])
        harness.gateway.submit(android(.message, device: "gone"))
        try harness.waitFor("the token to be removed") { $0.tokensRemoved == 1 }
        #expect(harness.invalidated.withLock { $0.first?.1.kind } == .fcm)
        harness.gateway.submit(android(.message, device: "busy"))
        try harness.waitFor("the 503 to be retried") { $0.retried == 1 }
        try harness.advance(by: .seconds(1))
        try harness.waitFor("the retry delivered") { $0.sent == 1 }
    }

    @Test("a call whose ring is over before its push could go is dropped, never sent late")
    func staleCallDropped() throws {
        let harness = try ProviderHarness { $0.callLifetime = .seconds(5) }
        try harness.mock.script([["status": 503, "reason": "ServiceUnavailable", "headers": ["retry-after": "10"], "match": "/3/device"]])
        harness.gateway.submit(iPhone(.call))
        try harness.waitFor("the failed attempt") { $0.retried == 1 }
        try harness.advance(by: .seconds(10))
        try harness.waitFor("the call to be given up") { $0.droppedExpired == 1 }
        #expect(harness.mock.requests.count == 1)
    }

    @Test("GOAWAY while pushes keep coming: the streams it refused go again on a new connection, each wake-up is answered exactly once, none is lost or rejected")
    func goAwayMidStream() throws {
        let harness = try ProviderHarness()
        func device(_ request: MockPushService.Request) -> String { (request.json["vs"] as? [String: Any])?["device"] as? String ?? "" }
        for index in 0..<50 { harness.gateway.submit(iPhone(.message, device: "d\(index)")) }
        try harness.waitFor("the first 50 sent") { $0.sent == 50 }
        // 50 more reach the mock and are left unanswered: streams in flight when GOAWAY comes.
        try harness.mock.command(["hang": true])
        for index in 50..<100 { harness.gateway.submit(iPhone(.message, device: "d\(index)")) }
        try harness.mock.waitFor("the 50 in flight") { $0.count == 100 }
        try harness.mock.command(["hang": false, "goaway": true])
        for index in 100..<150 { harness.gateway.submit(iPhone(.message, device: "d\(index)")) }
        // A stream GOAWAY refused is retried at once, not after a back-off: the clock stands still.
        try harness.waitFor("all 150 sent") { $0.sent == 150 }

        let goAway = try #require(harness.mock.goAways.first)
        let requests = harness.mock.requests
        let answered = requests.filter { $0.status != 0 }
        #expect(answered.count == 150 && Set(answered.map(device)).count == 150, "each wake-up answered exactly once")
        let refused = requests.filter { $0.status == 0 }
        #expect(refused.count == 50 && refused.allSatisfy { $0.connection == goAway.connection && $0.stream > goAway.lastStreamID })
        #expect(Set(refused.map(device)).isSubset(of: Set(answered.filter { $0.connection != goAway.connection }.map(device))),
                "the refused streams went again on the new connection")
        #expect(answered.filter { $0.connection == goAway.connection }.allSatisfy { $0.stream <= goAway.lastStreamID })
        #expect(harness.mock.connectionCount == 2)
        let statistics = harness.gateway.statistics
        #expect(statistics.rejected == 0 && statistics.dropped == 0 && statistics.rejectionReasons.isEmpty)
        #expect(statistics.failedAttempts == 0, "a refused stream is not a failed attempt: \(statistics)")
    }

    @Test("a push service that never answers holds only its own requests: they time out and are retried")
    func hangingService() throws {
        let harness = try ProviderHarness { $0.requestTimeout = .milliseconds(300) }
        try harness.mock.command(["hang": true])
        harness.gateway.submit(iPhone(.message))
        try harness.waitFor("the timed-out attempt") { $0.failedAttempts >= 1 && $0.inFlight == 0 }
        try harness.mock.command(["hang": false])
        try harness.advance(by: .seconds(2))
        try harness.waitFor("the retry delivered") { $0.sent == 1 }
    }
}

@Suite("Push routing and payloads")
struct PushRoutingTests {
    let all = PushRouting(services: [.apns, .fcm, .webhook])
    let registrations = [
        PushRegistration(platform: "apns-voip", token: [1]), PushRegistration(platform: "apns", token: [2]),
        PushRegistration(platform: "fcm", token: [3]), PushRegistration(platform: "relay", token: [4]),
    ]

    @Test("a call prefers the VoIP token, then FCM, then an APNs alert, then the webhook")
    func callPreference() {
        #expect(all.route(.call, registrations)?.registration.kind == .apnsVoIP)
        #expect(all.route(.call, Array(registrations.dropFirst()))?.registration.kind == .fcm)
        #expect(all.route(.call, [registrations[1], registrations[3]])?.registration.kind == .apns)
        #expect(all.route(.call, [registrations[3]])?.service == .webhook)
    }

    @Test("anything but a call never uses a VoIP token")
    func messagesAvoidVoIP() {
        #expect(all.route(.message, registrations)?.registration.kind == .apns)
        #expect(all.route(.message, [registrations[0]]) == nil)
        #expect(all.route(.receipt, [registrations[0], registrations[2]])?.registration.kind == .fcm)
    }

    @Test("a token whose service is not configured goes to the webhook gateway, or nowhere")
    func fallback() {
        let webhookOnly = PushRouting(services: [.webhook])
        #expect(webhookOnly.route(.call, registrations)?.service == .webhook)
        #expect(webhookOnly.route(.call, registrations)?.registration.kind == .apnsVoIP)
        let apnsOnly = PushRouting(services: [.apns])
        #expect(apnsOnly.route(.message, [registrations[2]]) == nil)
        #expect(!apnsOnly.canWake(.call, [registrations[2], registrations[3]]))
    }

    @Test("the platform name decides the kind; any unreserved name is a webhook token")
    func kinds() {
        #expect(PushTokenKind(platform: "apns-voip") == .apnsVoIP)
        #expect(PushTokenKind(platform: "fcm") == .fcm)
        #expect(PushTokenKind(platform: "webhook") == .webhook)
        #expect(PushTokenKind(platform: "my-relay") == .webhook)
    }
}
