import Foundation
import SignalingClient
import SignalingCrypto
import SignalingProtocol
import SignalingSupport
import TestSupport
import Testing
@testable import VoipClientKit
#if canImport(Glibc)
import Glibc
#endif

/// `voipclient` as operators and scripts run it: real subprocesses against a real
/// `voipserver` subprocess on an ephemeral loopback port.
@Suite("voipclient scripted modes")
struct VoipClientExecutableTests {
    /// A server whose calls ring out after a second, so "no answer" is quick. One event
    /// loop: a client's last ACK is read before the next client's HELLO, whatever the load.
    private func startServer(_ extra: [String] = []) throws -> ServerProcess {
        try ServerProcess(["--store", "memory", "--workers", "1", "--ring-timeout", "1", "--call-grace", "1"] + extra)
    }

    /// A short probe: 10 packets 5 ms apart.
    private let quickProbe = ["--probe-packets", "10", "--probe-interval", "5"]

    private func client(_ server: ServerProcess, _ user: String, _ arguments: [String]) -> [String] {
        ["--server", "127.0.0.1:\(server.port)", "--user", user] + arguments
    }

    private func run(_ arguments: [String], timeout: Double = 30) throws -> ExecutableRun {
        try ExecutableRun.run("voipclient", arguments, timeoutSeconds: timeout)
    }

    // MARK: Command line

    @Test("--help documents every option, the modes and the exit statuses, and exits 0")
    func help() throws {
        let result = try run(["--help"])
        #expect(result.exitCode == 0)
        for option in VoipClientOptions.parser.options {
            #expect(result.stdout.contains("--\(option.name)"), "--help does not mention --\(option.name)")
        }
        for text in ["listen", "call CALLEE", "send RECIPIENT", "EXIT STATUS", "69 server unreachable"] {
            #expect(result.stdout.contains(text), "--help does not mention \(text)")
        }
    }

    @Test("bad usage prints the reason and the usage, and exits 64", arguments: [
        [], ["--server", "127.0.0.1:1"], ["--server", "127.0.0.1:1", "--user", "a", "--no-such-option"],
        ["--server", "nowhere:port", "--user", "a"], ["--server", "127.0.0.1:1", "--user", "a", "call"],
        ["--server", "127.0.0.1:1", "--user", "a", "listen", "--auto-answer", "--auto-reject"],
        ["--server", "127.0.0.1:1", "--user", "a", "send", "b", "--timeout", "soon", "x"],
    ])
    func badUsage(arguments: [String]) throws {
        let result = try run(arguments)
        #expect(result.exitCode == 64)
        #expect(result.stderr.hasPrefix("voipclient: "), "\(result.stderr)")
        #expect(result.stderr.contains("USAGE: voipclient") && result.stderr.contains("--help"))
        #expect(result.stdout.isEmpty)
    }

    // MARK: Calls

    @Test("a listener answers and a caller completes the call: exit 0 on both sides, sensible timings, a probe both ways")
    func answeredCall() throws {
        let server = try startServer()
        let bob = try VoipClientProcess(client(server, "bob", ["listen", "--auto-answer", "--count", "1", "--json"] + quickProbe))
        #expect(bob.waitForOutput(#""event":"listening""#), "\(bob.stderr)")

        let alice = try run(client(server, "alice", ["call", "bob", "--hangup-after", "0.3", "--json", "--require-media"] + quickProbe))
        #expect(alice.exitCode == 0, "\(alice.stderr)\n\(alice.stdout)")
        let events = JSONLines(alice.stdout)
        #expect(events.events == ["connected", "call_invited", "call_ringing", "call_answered", "probe", "call_hangup", "result"])
        let result = try #require(events.first("result"))
        #expect(result["status"] as? String == "ok" && result["exit_code"] as? Int == 0)
        let ringing = try #require(result["invite_to_ringing_ms"] as? Double)
        let answer = try #require(result["invite_to_answer_ms"] as? Double)
        let call = try #require(result["answer_to_hangup_ms"] as? Double)
        #expect(ringing >= 0 && ringing <= answer && answer < 10_000, "invite→ringing \(ringing) ms, invite→answer \(answer) ms")
        #expect(call >= 300 && call < 20_000, "answer→hang-up \(call) ms, asked for 300")
        let probe = try #require(events.first("probe"))
        #expect(probe["sent"] as? Int == 10 && (probe["received"] as? Int ?? 0) > 0)
        #expect(probe["peer"] as? String == events.first("call_answered")?["peer_media"] as? String)

        #expect(bob.exitCode() == 0, "\(bob.stderr)")
        let bobEvents = JSONLines(bob.stdout)
        #expect(bobEvents.first("call_incoming")?["caller"] as? String == "alice")
        #expect(bobEvents.first("call_accepted") != nil)
        #expect((bobEvents.first("probe")?["received"] as? Int ?? 0) > 0, "the callee's probe came back too")
        #expect(bobEvents.first("call_ended")?["reason"] as? String == "hungUp")
        #expect(bobEvents.first("result")?["handled"] as? Int == 1)
    }

    @Test("a declined call exits 3 with the reason")
    func rejectedCall() throws {
        let server = try startServer()
        let bob = try VoipClientProcess(client(server, "bob", ["listen", "--auto-reject", "--count", "1"]))
        #expect(bob.waitForOutput("listening as bob"), "\(bob.stderr)")
        let alice = try run(client(server, "alice", ["call", "bob"]))
        #expect(alice.exitCode == 3)
        #expect(alice.stderr == "voipclient: bob declined the call\n")
        #expect(bob.exitCode() == 0)
        #expect(bob.stdout.contains("rejected call"))
    }

    @Test("a call nobody answers rings out: exit 4, and the listener reports the missed call")
    func unansweredCall() throws {
        let server = try startServer()
        let bob = try VoipClientProcess(client(server, "bob", ["listen", "--count", "1"]))
        #expect(bob.waitForOutput("listening as bob"), "\(bob.stderr)")
        let alice = try run(client(server, "alice", ["call", "bob"]))
        #expect(alice.exitCode == 4)
        #expect(alice.stderr.contains("no answer") && alice.stderr.contains("rang out"), "\(alice.stderr)")
        #expect(bob.exitCode() == 0)
        #expect(bob.stdout.contains("incoming call from alice") && bob.stdout.contains("no answer"))
    }

    @Test("--timeout cancels a ringing call and exits 4")
    func callTimeout() throws {
        let server = try ServerProcess(["--store", "memory", "--workers", "1"])  // rings for 60 s
        let bob = try VoipClientProcess(client(server, "bob", ["listen", "--count", "1", "--json"]))
        #expect(bob.waitForOutput(#""event":"listening""#), "\(bob.stderr)")
        let alice = try run(client(server, "alice", ["call", "bob", "--timeout", "0.5", "--json"]))
        #expect(alice.exitCode == 4)
        #expect(alice.stderr.contains("within --timeout") && alice.stderr.contains("cancelled"), "\(alice.stderr)")
        #expect(JSONLines(alice.stdout).first("call_cancelled") != nil)
        #expect(bob.exitCode() == 0)
        #expect(JSONLines(bob.stdout).first("call_ended")?["reason"] as? String == "cancelled")
    }

    @Test("a callee with no device online: exit 2")
    func offlineCallee() throws {
        let server = try startServer()
        let alice = try run(client(server, "alice", ["call", "nobody"]))
        #expect(alice.exitCode == 2)
        #expect(alice.stderr == "voipclient: nobody is unreachable: no device online\n")
    }

    @Test("a server that cannot be reached: exit 69 with the reason, quickly")
    func unreachableServer() throws {
        let port = closedLoopbackPort()
        for mode in [["call", "bob"], ["listen"], ["send", "bob", "hi"]] {
            let result = try run(["--server", "127.0.0.1:\(port)", "--user", "alice", "--json"] + mode, timeout: 20)
            #expect(result.exitCode == 69, "\(mode): \(result.stderr)")
            #expect(result.stderr.hasPrefix("voipclient: cannot reach 127.0.0.1:\(port)"), "\(result.stderr)")
            #expect(JSONLines(result.stdout).first("result")?["status"] as? String == "server_unreachable")
        }
    }

    @Test("--server with a list: the first server down, the message goes through the second, which the connected line names; every server down exits 69 naming the list")
    func serverList() throws {
        let server = try startServer()
        let down = closedLoopbackPort()
        let list = "127.0.0.1:\(down),127.0.0.1:\(server.port)"
        let bob = try VoipClientProcess(["--server", list, "--user", "bob", "listen", "--count", "1", "--json"])
        #expect(bob.waitForOutput(#""event":"listening""#), "\(bob.stderr)")
        let alice = try run(["--server", list, "--user", "alice", "send", "bob", "over the list", "--json"])
        #expect(alice.exitCode == 0, "\(alice.stderr)")
        #expect(JSONLines(alice.stdout).first("connected")?["server"] as? String == "127.0.0.1:\(server.port)")
        #expect(bob.exitCode() == 0)
        #expect(JSONLines(bob.stdout).first("message")?["body"] as? String == "over the list")

        let other = closedLoopbackPort()
        let nowhere = try run(["--server", "127.0.0.1:\(down),127.0.0.1:\(other)", "--user", "alice", "send", "bob", "hi"], timeout: 20)
        #expect(nowhere.exitCode == 69, "\(nowhere.stderr)")
        #expect(nowhere.stderr.hasPrefix("voipclient: cannot reach 127.0.0.1:\(down),127.0.0.1:\(other)"), "\(nowhere.stderr)")
    }

    @Test("SIGINT while ringing cancels the call and exits 130")
    func interruptedCall() throws {
        let server = try ServerProcess(["--store", "memory", "--workers", "1"])
        let bob = try VoipClientProcess(client(server, "bob", ["listen", "--count", "1"]))
        #expect(bob.waitForOutput("listening as bob"), "\(bob.stderr)")
        let alice = try VoipClientProcess(client(server, "alice", ["call", "bob"]))
        #expect(alice.waitForOutput("calling bob"), "\(alice.stderr)")
        #expect(bob.waitForOutput("incoming call from alice"))
        alice.process.send(signal: SIGINT)
        #expect(alice.exitCode() == 130)
        #expect(alice.stderr.contains("interrupted; the call was cancelled"), "\(alice.stderr)")
        #expect(bob.exitCode() == 0)
        #expect(bob.stdout.contains("alice cancelled"))
    }

    @Test("--require-media fails with exit 6 when the callee's announced probe address never answers")
    func mediaRequired() throws {
        let server = try startServer()
        // A callee in process that answers with the address of a socket nobody reads.
        let silent = try UDPProbeSocket(bindingTo: UDPEndpoint(host: "127.0.0.1", port: 0)!)
        defer { silent.close() }
        let answer = MediaDescription(endpoint: silent.local, origin: "test silent").bytes
        let events = DispatchQueue(label: "test.callee")
        let callee = LockedCallee()
        let bob = try SignalingClient(configuration: ClientConfiguration(host: "127.0.0.1", port: server.port, userID: "bob", deviceID: "test"),
                                      eventQueue: events) { event in
            if case .incomingCall(let call) = event { callee.answer(call.callID, with: answer) }
        }
        callee.client = bob
        defer { bob.shutdown() }
        try bob.connect(timeout: .seconds(10))

        let alice = try run(client(server, "alice", ["call", "bob", "--require-media", "--json", "--probe-packets", "5", "--probe-interval", "5"]))
        #expect(alice.exitCode == 6, "\(alice.stderr)")
        #expect(alice.stderr.contains("no probe packet came back (5 sent)"), "\(alice.stderr)")
        let probe = JSONLines(alice.stdout).first("probe")
        #expect(probe?["received"] as? Int == 0 && probe?["loss_pct"] as? Double == 100)
    }

    // MARK: Messages and credentials

    @Test("a message: send exits 0 once accepted (and delivered, when asked); the listener gets it once")
    func message() throws {
        let server = try startServer()
        let bob = try VoipClientProcess(client(server, "bob", ["listen", "--count", "1", "--json"]))
        #expect(bob.waitForOutput(#""event":"listening""#), "\(bob.stderr)")
        let alice = try run(client(server, "alice", ["send", "bob", "hello there", "--wait-delivered", "--json"]))
        #expect(alice.exitCode == 0, "\(alice.stderr)")
        #expect(JSONLines(alice.stdout).events == ["connected", "message_accepted", "delivered", "result"])
        #expect(bob.exitCode() == 0)
        let received = try #require(JSONLines(bob.stdout).first("message"))
        #expect(received["body"] as? String == "hello there" && received["sender"] as? String == "alice")

        // Acknowledged before the listener exited: the next run does not get it again.
        let again = try run(client(server, "bob", ["listen", "--count", "1", "--timeout", "1"]))
        #expect(again.exitCode == 4)
        #expect(!again.stdout.contains("hello there"))
    }

    @Test("push-register: the server accepts an APNs VoIP token with environment and topic, exit 0; --auth-key-file credentials beside --token")
    func pushRegister() throws {
        let scratch = try TemporaryDirectory()
        let keys = scratch.file("keys")
        try "k1 \(String(repeating: "k", count: 40))\n".write(toFile: keys, atomically: false, encoding: .utf8)
        let server = try startServer(["--auth-key-file", keys])
        let result = try run(client(server, "bob", [
            "push-register", "--kind", "apns-voip", "--token", String(repeating: "9a", count: 32), "--environment", "sandbox",
            "--topic", "com.example.app", "--auth-key-file", keys, "--json",
        ]))
        #expect(result.exitCode == 0, "\(result.stderr)")
        #expect(JSONLines(result.stdout).events == ["connected", "push_registered", "result"])
        let registered = try #require(JSONLines(result.stdout).first("push_registered"))
        #expect(registered["kind"] as? String == "apns-voip" && registered["token_bytes"] as? Int == 32)
        #expect(registered["environment"] as? String == "sandbox" && registered["topic"] as? String == "com.example.app")
    }

    @Test("a message pending for the callee: listen --count 1 ends on it and the call finds nobody; --count-calls 1 waits for the call")
    func pendingMessageBeforeCall() throws {
        // The README's first session, with a message already waiting for bob.
        let server = try startServer()
        #expect(try run(client(server, "carol", ["send", "bob", "left for you earlier"])).exitCode == 0)
        let counting = try VoipClientProcess(client(server, "bob", ["listen", "--auto-answer", "--count", "1"] + quickProbe))
        #expect(counting.exitCode() == 0, "\(counting.stderr)")  // --count counts the pending message
        #expect(counting.stdout.contains("left for you earlier"))
        #expect(try run(client(server, "alice", ["call", "bob"] + quickProbe)).exitCode == 2)  // bob is gone

        #expect(try run(client(server, "carol", ["send", "bob", "another one"])).exitCode == 0)
        let bob = try VoipClientProcess(client(server, "bob", ["listen", "--auto-answer", "--count-calls", "1"] + quickProbe))
        #expect(bob.waitForOutput("another one"), "\(bob.stderr)")
        #expect(bob.process.poll() == nil, "a message ended listen --count-calls")
        let alice = try run(client(server, "alice", ["call", "bob"] + quickProbe))
        #expect(alice.exitCode == 0, "\(alice.stderr)")
        #expect(bob.exitCode() == 0, "\(bob.stderr)")
        #expect(bob.stdout.contains("handled 1 call and 1 message"), "\(bob.stdout)")
    }

    @Test("interactive: quit with a message the server never accepted warns and exits 8")
    func unsentMessageAtQuit() throws {
        let scratch = try TemporaryDirectory("voipclient-unsent")
        let process = try ChildProcess.spawn(
            ExecutableRun.path(of: "voipclient"),
            arguments: ["--server", "127.0.0.1:\(closedLoopbackPort())", "--user", "carol"], pipeInput: true,
            stdout: .file(scratch.file("out")), stderr: .file(scratch.file("err")))
        func type(_ line: String) { _ = Array(line.utf8).withUnsafeBytes { write(process.input, $0.baseAddress, $0.count) } }
        type("msg bob are you there?\n")
        let deadline = SystemClock().now() + .seconds(20)
        while !(readTextFile(scratch.file("out")) ?? "").contains("the message is kept") {
            guard SystemClock().now() < deadline, process.poll() == nil else {
                Issue.record("no 'kept' line: \(readTextFile(scratch.file("out")) ?? "") \(readTextFile(scratch.file("err")) ?? "")")
                return
            }
            usleep(10_000)
        }
        type("quit\n")
        let status = process.waitForExit(timeoutSeconds: 20).map { ($0 >> 8) & 0xff }
        let stderr = readTextFile(scratch.file("err")) ?? ""
        #expect(status == ExitStatus.unsentMessages.rawValue, "\(stderr)")
        #expect(stderr.contains("1 message not accepted by the server, now dropped") && stderr.contains("to bob"), "\(stderr)")
    }

    @Test("credentials: a wrong token is refused with exit 5, --auth-secret computes the right one")
    func credentials() throws {
        let server = try startServer(["--auth-secret", "s3cret"])
        let wrong = try run(client(server, "alice", ["--token", String(repeating: "0", count: 64), "send", "bob", "hi"]))
        #expect(wrong.exitCode == 5)
        #expect(wrong.stderr.contains("unauthorized"), "\(wrong.stderr)")
        let missing = try run(client(server, "alice", ["send", "bob", "hi"]))
        #expect(missing.exitCode == 5)
        let right = try run(client(server, "alice", ["--auth-secret", "s3cret", "send", "bob", "hi"]))
        #expect(right.exitCode == 0, "\(right.stderr)")
    }

    @Test("device tokens: --auth-key-file mints one the server accepts; an expired --token exits 5 naming the refusal")
    func deviceTokens() throws {
        let scratch = try TemporaryDirectory("voipclient-tokens")
        let keyFile = scratch.file("keys")
        try "k1 \(String(repeating: "k", count: 40))\n".write(toFile: keyFile, atomically: false, encoding: .utf8)
        let server = try startServer(["--auth-key-file", keyFile])
        let right = try run(client(server, "alice", ["--auth-key-file", keyFile, "send", "bob", "hi"]))
        #expect(right.exitCode == 0, "\(right.stderr)")
        let minted = try ExecutableRun.run("voipserver", ["token", "--user", "alice", "--ttl", "1h", "--key-file", keyFile], timeoutSeconds: 30)
        let token = minted.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(try run(client(server, "alice", ["--token", token, "send", "bob", "hi"])).exitCode == 0)
        let expired = try DeviceToken.mint(
            DeviceTokenClaims(userID: "alice", deviceID: nil, expiresAt: 1_000_000_000),
            key: try TokenKey(id: "k1", secret: Array(String(repeating: "k", count: 40).utf8)))
        let refused = try run(client(server, "alice", ["--token", expired, "send", "bob", "hi"]))
        #expect(refused.exitCode == 5)
        #expect(refused.stderr.contains("tokenExpired"), "\(refused.stderr)")
    }

    @Test("over TLS (--tls --ca-file) a listener gets a message; an untrusted CA or a wrong --pin exits 5 with one line naming the certificate problem")
    func overTLS() throws {
        let certificates = try TestCertificates()
        let server = try startServer(["--tls-listen", "127.0.0.1:0", "--tls-cert", certificates.serverChainFile, "--tls-key", certificates.serverKeyFile])
        let port = try #require(server.tlsPort)
        let tls = ["--server", "localhost:\(port)", "--tls", "--ca-file", certificates.caFile]
        let bob = try VoipClientProcess(tls + ["--user", "bob", "listen", "--count", "1", "--json"])
        #expect(bob.waitForOutput(#""event":"listening""#), "\(bob.stderr)")
        let alice = try run(tls + ["--user", "alice", "send", "bob", "hello over TLS", "--wait-delivered"])
        #expect(alice.exitCode == 0, "\(alice.stderr)")
        #expect(bob.exitCode() == 0, "\(bob.stderr)")
        #expect(bob.stdout.contains("hello over TLS"))

        let stranger = try TestCertificates()
        let untrusted = try run(["--server", "127.0.0.1:\(port)", "--ca-file", stranger.caFile, "--user", "carol", "send", "bob", "x"])
        #expect(untrusted.exitCode == 5)
        #expect(untrusted.stderr.contains("certificate was rejected") && untrusted.stderr.contains("unable to get local issuer"), "\(untrusted.stderr)")
        #expect(untrusted.stderr.split(separator: "\n").count == 1, "one line: \(untrusted.stderr)")
        let pinned = try run(tls + ["--pin", String(repeating: "ab", count: 32), "--user", "carol", "send", "bob", "x"])
        #expect(pinned.exitCode == 5)
        #expect(pinned.stderr.contains("matches no --pin"), "\(pinned.stderr)")
    }

    @Test("a second copy of the same device takes over: the first listener is told to stop and exits 5")
    func replaced() throws {
        let server = try startServer()
        let first = try VoipClientProcess(client(server, "bob", ["listen"]))
        #expect(first.waitForOutput("listening as bob"), "\(first.stderr)")
        let second = try VoipClientProcess(client(server, "bob", ["listen", "--count", "1"]))
        #expect(first.exitCode() == 5)
        #expect(first.stderr.contains("for good: replaced"), "\(first.stderr)")
        #expect(second.waitForOutput("listening as bob"), "\(second.stderr)")
    }
}

/// The in-process callee of `mediaRequired`: answers each incoming call once.
private final class LockedCallee: @unchecked Sendable {
    private let lock = NSLock()
    private var _client: SignalingClient?

    var client: SignalingClient? {
        get { lock.withLock { _client } }
        set { lock.withLock { _client = newValue } }
    }

    func answer(_ callID: String, with answer: [UInt8]) {
        client?.sendRinging(callID: callID)
        client?.accept(callID: callID, answer: answer)
    }
}
