import SignalingCrypto
import Foundation
import SignalingProtocol
import SignalingSupport
import SignalingTLS
import TestSupport
import Testing
@testable import VoipClientKit

@Suite("Command line")
struct OptionsTests {
    private let base = ["--server", "127.0.0.1:7443", "--user", "alice"]

    private func command(_ arguments: [String]) throws -> VoipClientCommand {
        guard case .run(let command) = try VoipClientOptions.parse(arguments) else { throw UsageError("help") }
        return command
    }

    private func mistake(_ arguments: [String]) -> String? {
        do {
            _ = try VoipClientOptions.parse(arguments)
            return nil
        } catch {
            return error.message
        }
    }

    @Test("each mode with its options, in any order")
    func modes() throws {
        guard case .interactive(let common) = try command(base) else { Issue.record("not interactive"); return }
        #expect(common.servers == [ServerAddress(host: "127.0.0.1", port: 7443)] && common.device == "voipclient" && !common.json)

        guard case .call(let callCommon, let call) = try command(["call", "bob", "--hangup-after", "2.5"] + base + ["--json", "--timeout", "9"])
        else { Issue.record("not call"); return }
        #expect(call == {
            var expected = CallOptions(callee: "bob")
            expected.hangupAfter = .milliseconds(2500)
            expected.timeout = .seconds(9)
            return expected
        }())
        #expect(callCommon.json)

        guard case .listen(_, let listen) = try command(base + ["listen", "--auto-answer", "--count", "3", "--answer-after", "0.2"])
        else { Issue.record("not listen"); return }
        #expect(listen.answering == .autoAnswer && listen.count == 3 && listen.answerAfter == .milliseconds(200) && listen.timeout == nil)
        #expect(!listen.countCallsOnly)
        guard case .listen(_, let callsOnly) = try command(base + ["listen", "--count-calls", "2"]) else { Issue.record("not listen"); return }
        #expect(callsOnly.count == 2 && callsOnly.countCallsOnly)

        guard case .send(_, let send) = try command(base + ["send", "--wait-delivered", "bob", "--", "-not an option"]) else {
            Issue.record("not send")
            return
        }
        #expect(send.recipient == "bob" && send.body == .text("-not an option") && send.waitDelivered,
                "after '--' everything is an operand")
        guard case .send(_, let fromInput) = try command(base + ["send", "bob", "-", "--message-id", "m-1"]) else { return }
        #expect(fromInput.body == .standardInput && fromInput.messageID == "m-1")
    }

    @Test("TLS options: --tls alone trusts the system store; --ca-file, --server-name and --pin imply TLS; pins repeat; a bad pin is a usage error")
    func tlsOptions() throws {
        guard case .interactive(let plain) = try command(base) else { Issue.record("not interactive"); return }
        #expect(plain.tls == nil)
        guard case .interactive(let system) = try command(base + ["--tls"]) else { Issue.record("not interactive"); return }
        #expect(system.tls == TLSClientConfiguration())
        let first = String(repeating: "ab", count: 32), second = String(repeating: "0F", count: 32)
        guard case .listen(let common, _) = try command(
            base + ["listen", "--ca-file", "/etc/ca.pem", "--server-name", "signal.example.net", "--pin", first, "--pin", second])
        else { Issue.record("not listen"); return }
        #expect(common.tls == TLSClientConfiguration(
            caFile: "/etc/ca.pem", serverName: "signal.example.net", pins: [PublicKeyPin(hex: first)!, PublicKeyPin(hex: second)!]))
        #expect(mistake(base + ["--pin", "abc"])?.contains("64 hex digits") == true)
        #expect(mistake(base + ["--pin", String(repeating: "zz", count: 32)])?.contains("--pin") == true)
        #expect(mistake(base + ["--server-name", ""]) != nil)
    }

    @Test("server addresses: host, port, IPv6 in brackets, default port")
    func serverAddresses() throws {
        #expect(try ServerAddress(parsing: "signal.example.net") == ServerAddress(host: "signal.example.net", port: 7443))
        #expect(try ServerAddress(parsing: "10.0.0.1:9000") == ServerAddress(host: "10.0.0.1", port: 9000))
        #expect(try ServerAddress(parsing: "[::1]:9000") == ServerAddress(host: "::1", port: 9000))
        #expect(try ServerAddress(parsing: "[::1]").description == "[::1]:7443")
        for bad in ["::1", "host:", "host:0", "host:70000", ":7443", "[::1", "[::1]x", "a b:1"] {
            #expect(throws: UsageError.self, "\(bad)") { try ServerAddress(parsing: bad) }
        }
    }

    @Test("--server takes a comma-separated list of servers, in order; an empty or bad entry is a usage error")
    func serverList() throws {
        #expect(try ServerAddress.parseList("a.example:1,[::1]:2,10.0.0.3")
                == [ServerAddress(host: "a.example", port: 1), ServerAddress(host: "::1", port: 2), ServerAddress(host: "10.0.0.3", port: 7443)])
        #expect(ServerAddress.describe([ServerAddress(host: "a", port: 1), ServerAddress(host: "::1", port: 2)]) == "a:1,[::1]:2")
        #expect(try command(["--server", "127.0.0.1:1,127.0.0.1:2", "--user", "alice"]).common.servers.map(\.port) == [1, 2])
        for bad in ["a:1,", ",a:1", "a:1,,b:2", "a:1,b:0"] {
            #expect(throws: UsageError.self, "\(bad)") { try ServerAddress.parseList(bad) }
        }
    }

    @Test("credentials: a token, a token file, or the token computed from the server's secret")
    func credentials() throws {
        #expect(try command(base + ["--token", "abc"]).common.credentials == Array("abc".utf8))
        #expect(try command(base + ["--auth-secret", "s3cret"]).common.credentials == LegacyToken.make(secret: "s3cret", userID: "alice"))
        let directory = try TemporaryDirectory("voipclient-options")
        let path = directory.file("token")
        try "  0123abcd  \nignored\n".write(toFile: path, atomically: false, encoding: .utf8)
        #expect(try command(base + ["--token-file", path]).common.credentials == Array("0123abcd".utf8))
        #expect(mistake(base + ["--token", "a", "--auth-secret", "b"])?.contains("only one of") == true)
        #expect(mistake(base + ["--token-file", directory.file("missing")])?.contains("cannot read") == true)
    }

    @Test("fresh credentials: --token-file is read again, --auth-key-file mints with the file's last key at that moment")
    func credentialSources() throws {
        let directory = try TemporaryDirectory("voipclient-credentials")
        let tokenPath = directory.file("token")
        try "first\n".write(toFile: tokenPath, atomically: false, encoding: .utf8)
        let fromFile = try command(base + ["--token-file", tokenPath]).common
        #expect(fromFile.credentialsSource == .tokenFile(tokenPath))
        try "second\n".write(toFile: tokenPath, atomically: false, encoding: .utf8)
        #expect(fromFile.credentialsSource.credentials(user: "alice", device: "voipclient", now: 0) == Array("second".utf8))
        #expect(try command(base + ["--token", "abc"]).common.credentialsSource == .fixed)

        let keyPath = directory.file("keys")
        let secret = String(repeating: "s", count: 32)
        try "k1 \(secret)\n".write(toFile: keyPath, atomically: false, encoding: .utf8)
        let minted = try command(base + ["--auth-key-file", keyPath]).common
        #expect(minted.credentials.map { String(decoding: $0, as: UTF8.self).hasPrefix("v1.k1.") } == true)
        try "k1 \(secret)\nk2 \(secret)\n".write(toFile: keyPath, atomically: false, encoding: .utf8)
        let fresh = minted.credentialsSource.credentials(user: "alice", device: "voipclient", now: 1_000)
        let verifier = try TokenVerifier(keys: [try TokenKey(id: "k2", secret: Array(secret.utf8))])
        #expect(verifier.verify(fresh, userID: "alice", deviceID: "voipclient", now: 1_000 + 3599) == .accepted(expiresAt: 1_000 + 3600))
        try "# none\n".write(toFile: keyPath, atomically: false, encoding: .utf8)
        #expect(mistake(base + ["--auth-key-file", keyPath])?.contains("no keys") == true)
        #expect(mistake(base + ["--auth-key-file", keyPath, "--token", "a"])?.contains("only one of") == true)
    }

    @Test("media options")
    func media() throws {
        let common = try command(base + ["call", "bob", "--media-address", "::1", "--media-port", "40000", "--probe-packets", "5",
                                         "--probe-interval", "10", "--max-loss", "20"]).common
        #expect(common.media.address == "::1" && common.media.port == 40000 && common.media.packets == 5)
        #expect(common.media.interval == .milliseconds(10) && common.media.maximumLossPercent == 20)
        #expect(try command(base + ["listen", "--require-media"]).common.media.maximumLossPercent == ProbeVerdict.anythingButTotalLoss)
        #expect(try command(base + ["listen"]).common.media.maximumLossPercent == nil)
        #expect(mistake(base + ["--media-address", "localhost"])?.contains("numeric") == true)
        #expect(mistake(base + ["listen", "--require-media", "--probe-packets", "0"])?.contains("need probe packets") == true)
    }

    @Test("mistakes are explained", arguments: [
        ([], "--server"),
        (["--server", "h:1"], "--user"),
        (["--server", "h:1", "--user", "a", "dance"], "unknown mode"),
        (["--server", "h:1", "--user", "a", "call"], "one callee"),
        (["--server", "h:1", "--user", "a", "call", "a"], "yourself"),
        (["--server", "h:1", "--user", "a", "listen", "--auto-answer", "--auto-reject"], "not both"),
        (["--server", "h:1", "--user", "a", "listen", "--count", "1", "--count-calls", "1"], "--count or --count-calls, not both"),
        (["--server", "h:1", "--user", "a", "listen", "--hangup-after", "1"], "does not apply to 'listen'"),
        (["--server", "h:1", "--user", "a", "--count", "1"], "does not apply to the interactive mode"),
        (["--server", "h:1", "--user", "a", "--json"], "--json does not apply to the interactive mode"),
        (["--server", "h:1", "--user", "a", "send", "b", "x", "--require-media"], "does not apply to 'send'"),
        (["--server", "h:1", "--user", "a", "listen", "--answer-after", "1"], "needs --auto-answer"),
        (["--server", "h:1", "--user", "a", "send", "bob"], "a recipient and a text"),
        (["--server", "h:1", "--user", String(repeating: "u", count: 129)], "1-128 bytes"),
        (["--server", "h:1", "--user", "a\u{7}b"], "control characters"),
        (["--server", "h:1", "--user", "a", "call", "b", "--timeout", "0"], "--timeout"),
        (["--server", "h:1", "--user", "a", "--log-level", "loud"], "--log-level"),
    ])
    func mistakes(arguments: [String], expected: String) {
        let message = mistake(arguments)
        #expect(message?.contains(expected) == true, "\(arguments): \(message ?? "accepted")")
    }

    @Test("--help anywhere asks for help")
    func help() throws {
        #expect(try VoipClientOptions.parse(["call", "--help"]) == .help)
        #expect(try VoipClientOptions.parse(["-h"]) == .help)
    }

    @Test("push-register: kinds, hex or text tokens, APNs fields; --token is the push token there, credentials come from the other options")
    func pushRegister() throws {
        guard case .pushRegister(let common, let options) = try command(
            base + ["push-register", "--kind", "apns-voip", "--token", "0aFF", "--environment", "sandbox", "--topic", "com.x", "--timeout", "3"])
        else { Issue.record("not push-register"); return }
        #expect(common.credentials == nil)
        #expect(options == {
            var expected = PushRegisterOptions(kind: .apnsVoIP, token: [0x0A, 0xFF])
            expected.environment = .sandbox
            expected.topic = "com.x"
            expected.timeout = .seconds(3)
            return expected
        }())
        guard case .pushRegister(let secretCommon, let fcm) = try command(
            base + ["push-register", "--kind", "fcm", "--token-text", "abc", "--auth-secret", "s"])
        else { Issue.record("not push-register"); return }
        #expect(fcm == PushRegisterOptions(kind: .fcm, token: Array("abc".utf8)) && secretCommon.credentials != nil)
        guard case .pushRegister(_, let webhook) = try command(base + ["push-register", "--kind", "relay", "--token", ""])
        else { Issue.record("not push-register"); return }
        #expect(webhook == PushRegisterOptions(kind: .webhook(platform: "relay"), token: []))

        let push = base + ["push-register"]
        #expect(mistake(push + ["--token", "00"])?.contains("--kind") == true)
        #expect(mistake(push + ["--kind", "apns"])?.contains("--token HEX or --token-text") == true)
        #expect(mistake(push + ["--kind", "apns", "--token", "abc"])?.contains("hex digits") == true)
        #expect(mistake(push + ["--kind", "apns", "--token", "zz"])?.contains("hex digits") == true)
        #expect(mistake(push + ["--kind", "apns", "--token", "00", "--token-text", "x"])?.contains("not both") == true)
        #expect(mistake(push + ["--kind", "apns", "--token", "00", "--environment", "staging"])?.contains("production or sandbox") == true)
        #expect(mistake(push + ["--kind", "fcm", "--token", "00", "--topic", "com.x"])?.contains("APNs tokens") == true)
        #expect(mistake(push + ["--kind", "apns", "--token", "00", "extra"])?.contains("no operand") == true)
        #expect(mistake(base + ["send", "bob", "hi", "--kind", "apns"])?.contains("does not apply") == true)
        #expect(mistake(push + ["--kind", "apns", "--token", "00", "--token-file", "/nonexistent", "--auth-secret", "s"])?
            .contains("give only one of --token-file, --auth-secret and --auth-key-file") == true)
    }

}
