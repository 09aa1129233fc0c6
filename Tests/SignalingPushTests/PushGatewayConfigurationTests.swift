import SignalingSupport
import Testing
@testable import SignalingPush

@Suite("Gateway configuration")
struct PushGatewayConfigurationTests {
    @Test("http URLs: host, port (default 80), path (default /), IPv6 literals")
    func parsesURLs() throws {
        #expect(try GatewayEndpoint(url: "http://127.0.0.1:8088/push/wake") == GatewayEndpoint(host: "127.0.0.1", port: 8088, path: "/push/wake"))
        #expect(try GatewayEndpoint(url: "http://relay.internal") == GatewayEndpoint(host: "relay.internal", port: 80, path: "/"))
        #expect(try GatewayEndpoint(url: "HTTP://relay:81?key=1") == GatewayEndpoint(host: "relay", port: 81, path: "/?key=1"))
        #expect(try GatewayEndpoint(url: "http://[::1]:9000/w#frag") == GatewayEndpoint(host: "::1", port: 9000, path: "/w"))
        #expect(try GatewayEndpoint(url: "http://[::1]:9000/w").hostHeader == "[::1]:9000")
        #expect(try GatewayEndpoint(url: "http://relay/w").hostHeader == "relay")
    }

    @Test("https and malformed URLs are refused with a reason")
    func refusesURLs() {
        #expect(throws: UsageError.self) { try GatewayEndpoint(url: "https://api.push.apple.com/3/device") }
        do {
            _ = try GatewayEndpoint(url: "https://gateway/wake")
            Issue.record("https accepted")
        } catch {
            #expect(error.message.contains("relay"))
        }
        for bad in ["gateway:80/wake", "http://", "http://:80/", "http://host:0/", "http://host:99999/", "http://host:x/",
                    "http://user:pw@host/", "http://[::1/", "http://host/a b"] {
            #expect(throws: UsageError.self, "\(bad)") { try GatewayEndpoint(url: bad) }
        }
    }

    @Test("defaults are valid and documented values; inconsistent settings are refused")
    func validation() throws {
        let defaults = try PushGatewayConfiguration(url: "http://127.0.0.1:1/")
        try defaults.validate()
        #expect(defaults.maxBodyBytes == 4096)
        #expect(defaults.requestTimeout == .seconds(5))
        #expect(defaults.minimumInterval == .seconds(10))
        #expect(defaults.minimumBackoff == .seconds(1) && defaults.maximumBackoff == .seconds(300))
        var bad = defaults
        bad.maximumBackoff = .milliseconds(500)
        #expect(throws: UsageError.self) { try bad.validate() }
        bad = defaults
        bad.maxConcurrentRequests = 0
        #expect(throws: UsageError.self) { try bad.validate() }
        bad = defaults
        bad.maxAttempts = 0
        #expect(throws: UsageError.self) { try bad.validate() }
        #expect(throws: UsageError.self) { try PushGateway(configuration: bad) }
    }
}
