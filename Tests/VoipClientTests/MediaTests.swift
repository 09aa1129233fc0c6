import Foundation
import SignalingSupport
import Synchronization
import Testing
@testable import VoipClientKit
#if canImport(Glibc)
import Glibc
#endif

@Suite("Offer and answer text")
struct MediaDescriptionTests {
    @Test("IPv4 and IPv6 round trips; CRLF, LF and extra lines are all fine")
    func roundTrip() throws {
        let v4 = MediaDescription(endpoint: try #require(UDPEndpoint(host: "127.0.0.1", port: 40312)), origin: "voipclient alice phone")
        #expect(v4.text == "v=0\r\no=voipclient alice phone\r\nc=IN IP4 127.0.0.1\r\nm=probe 40312 udp vcprobe/1\r\n")
        #expect(MediaDescription.parse(v4.bytes) == .success(v4))
        let v6 = MediaDescription(endpoint: try #require(UDPEndpoint(host: "::1", port: 9)), origin: "x")
        #expect(v6.text.contains("c=IN IP6 ::1"))
        #expect(MediaDescription.parse(v6.bytes) == .success(v6))
        let foreign = "v=0\ns=app\nc=IN IP4 10.1.2.3\nm=audio 5004 RTP/AVP 0\nm=probe 6000 udp vcprobe/1\na=extra\n"
        #expect(try MediaDescription.parse(Array(foreign.utf8)).get().endpoint == UDPEndpoint(host: "10.1.2.3", port: 6000))
    }

    @Test("what is missing or wrong is named", arguments: [
        ("v=0\r\no=voipclient a b\r\n", MediaDescription.ParseError.missingConnectionLine),
        ("c=IN IP4 1.2.3.4\r\n", .missingProbeLine),
        ("c=IN IP4 example.com\r\nm=probe 5 udp\r\n", .badAddress("example.com")),
        ("c=IN IP4 1.2.3.4\r\nm=probe 0 udp\r\n", .badPort("m=probe 0 udp")),
        ("c=IN IPX 1.2.3.4\r\nm=probe 5\r\n", .badAddress("c=IN IPX 1.2.3.4")),
    ])
    func errors(text: String, expected: MediaDescription.ParseError) {
        #expect(MediaDescription.parse(Array(text.utf8)) == .failure(expected))
    }

    @Test("binary blobs are not descriptions")
    func binary() {
        #expect(MediaDescription.parse([0xFF, 0xFE, 0x00]) == .failure(.notText))
    }
}

@Suite("Probe packets and figures")
struct ProbeFigureTests {
    @Test("a packet survives encoding, is 172 bytes, and its echo keeps token, sequence and timestamp")
    func packet() throws {
        let packet = ProbePacket(kind: .request, token: 0x0102_0304_0506_0708, sequence: 77, sentAt: 123_456_789_012)
        let bytes = packet.bytes
        #expect(bytes.count == ProbePacket.wireSize)
        #expect(Array(bytes[0..<8]) == Array("VCPR".utf8) + [1, 1, 0, 0])
        #expect(ProbePacket(decoding: bytes) == packet)
        #expect(ProbePacket(decoding: packet.echo.bytes) == ProbePacket(kind: .echo, token: packet.token, sequence: 77, sentAt: packet.sentAt))
        #expect(ProbePacket(decoding: Array(bytes[0..<27])) == nil)
        var wrong = bytes
        wrong[4] = 2
        #expect(ProbePacket(decoding: wrong) == nil, "another version")
        wrong = bytes
        wrong[5] = 9
        #expect(ProbePacket(decoding: wrong) == nil, "an unknown kind")
        #expect(ProbePacket(decoding: Array("GET / HTTP/1.1\r\nHost: x\r\n\r\n".utf8)) == nil)
    }

    @Test("loss, round trips and the RFC 3550 jitter estimator")
    func statistics() {
        let figures = ProbeStatistics(sent: 10, roundTrips: [.milliseconds(10), .milliseconds(14), .milliseconds(12), .milliseconds(12)])
        #expect(figures.received == 4 && figures.lossPercent == 60)
        #expect(figures.minimumRoundTrip == .milliseconds(10) && figures.maximumRoundTrip == .milliseconds(14))
        #expect(figures.averageRoundTrip == .milliseconds(12))
        // J1 = 4/16 = 0.25; J2 = 0.25 + (2 - 0.25)/16 = 0.359375; J3 = J2 + (0 - J2)/16 = 0.336914...
        let expected = 0.359375 - 0.359375 / 16
        #expect(abs(figures.jitter!.seconds * 1000 - expected) < 1e-6)
        let none = ProbeStatistics(sent: 5, roundTrips: [])
        #expect(none.lossPercent == 100 && none.averageRoundTrip == nil && none.jitter == nil)
        #expect(ProbeStatistics(sent: 0, roundTrips: []).lossPercent == 0)
    }

    @Test("--require-media fails only on total loss; --max-loss on more loss than allowed")
    func verdict() {
        let half = ProbeStatistics(sent: 10, roundTrips: Array(repeating: .milliseconds(1), count: 5))
        #expect(ProbeVerdict.failure(of: half, maximumLossPercent: ProbeVerdict.anythingButTotalLoss) == nil)
        #expect(ProbeVerdict.failure(of: half, maximumLossPercent: 50) == nil)
        #expect(ProbeVerdict.failure(of: half, maximumLossPercent: 20)?.contains("over --max-loss") == true)
        #expect(ProbeVerdict.failure(of: ProbeStatistics(sent: 10, roundTrips: []), maximumLossPercent: 100)?.contains("no probe packet came back") == true)
        #expect(ProbeVerdict.failure(of: nil, maximumLossPercent: 100) != nil)
    }
}

/// Real UDP sockets on loopback.
@Suite("Call probe")
struct CallProbeTests {
    /// Collects a probe's reports; `wait` blocks (on the test's thread) until one matches.
    final class Reports: Sendable {
        private let reports = Mutex<[CallProbe.Report]>([])
        private let arrived = DispatchSemaphore(value: 0)

        func add(_ report: CallProbe.Report) {
            reports.withLock { $0.append(report) }
            arrived.signal()
        }

        func wait(within timeout: Duration = .seconds(10), for matches: (CallProbe.Report) -> Bool) -> CallProbe.Report? {
            let deadline = SystemClock().now() + timeout
            while true {
                if let found = reports.withLock({ $0.first(where: matches) }) { return found }
                let now = SystemClock().now()
                guard now < deadline, arrived.wait(timeout: .now() + (deadline - now).dispatchInterval) == .success else { return nil }
            }
        }

        static func statistics(_ report: CallProbe.Report?) -> ProbeStatistics? {
            if case .burstFinished(let statistics, _)? = report { return statistics }
            return nil
        }
    }

    private let loopback = UDPEndpoint(host: "127.0.0.1", port: 0)!
    private let configuration = CallProbe.Configuration(packets: 20, interval: .milliseconds(2), lateWait: .milliseconds(500))

    @Test("two probes echo each other: every packet comes back, each side learns the other is done")
    func bothWays() throws {
        let aliceReports = Reports()
        let bobReports = Reports()
        let alice = try CallProbe(bindingTo: loopback, configuration: configuration) { aliceReports.add($0) }
        let bob = try CallProbe(bindingTo: loopback, configuration: configuration) { bobReports.add($0) }
        defer { alice.stop(); bob.stop() }
        #expect(alice.local.port != 0 && alice.local.port != bob.local.port && alice.token != bob.token)
        alice.start()
        bob.start()
        alice.beginBurst(to: bob.local)
        bob.beginBurst(to: alice.local)
        let aliceFigures = Reports.statistics(aliceReports.wait { if case .burstFinished = $0 { true } else { false } })
        let bobFigures = Reports.statistics(bobReports.wait { if case .burstFinished = $0 { true } else { false } })
        for figures in [aliceFigures, bobFigures] {
            #expect(figures?.sent == 20 && figures?.received == 20 && figures?.lossPercent == 0)
            #expect((figures?.averageRoundTrip ?? .seconds(9)) < .seconds(1), "a loopback round trip under a second")
        }
        #expect(aliceReports.wait { $0 == .peerFinished } != nil)
        #expect(bobReports.wait { $0 == .peerFinished } != nil)
    }

    @Test("a peer that never answers: total loss, reported once the late-echo wait is over")
    func silentPeer() throws {
        // A bound socket that nobody reads: datagrams arrive and are never echoed.
        let silent = try UDPProbeSocket(bindingTo: loopback)
        defer { silent.close() }
        let reports = Reports()
        let probe = try CallProbe(bindingTo: loopback, configuration: configuration) { reports.add($0) }
        defer { probe.stop() }
        probe.start()
        let started = SystemClock().now()
        probe.beginBurst(to: silent.local)
        let figures = Reports.statistics(reports.wait { if case .burstFinished = $0 { true } else { false } })
        #expect(figures?.sent == 20 && figures?.received == 0 && figures?.lossPercent == 100)
        #expect(SystemClock().now() - started >= configuration.lateWait, "it waited for late echoes")
    }

    @Test("no packets configured: the burst is over at once and the peer is told")
    func noPackets() throws {
        let listenerReports = Reports()
        let listener = try CallProbe(bindingTo: loopback, configuration: configuration) { listenerReports.add($0) }
        let reports = Reports()
        let probe = try CallProbe(bindingTo: loopback, configuration: CallProbe.Configuration(packets: 0)) { reports.add($0) }
        defer { probe.stop(); listener.stop() }
        listener.start()
        probe.start()
        probe.beginBurst(to: listener.local)
        #expect(Reports.statistics(reports.wait { if case .burstFinished = $0 { true } else { false } })?.sent == 0)
        #expect(listenerReports.wait { $0 == .peerFinished } != nil)
    }

    @Test("stop ends the thread and frees the port; stopping twice is harmless")
    func stop() throws {
        let probe = try CallProbe(bindingTo: loopback, configuration: configuration) { _ in }
        probe.start()
        let port = probe.local.port
        probe.stop()
        probe.stop()
        let again = try UDPProbeSocket(bindingTo: loopback.withPort(port))
        again.close()
    }
}

@Suite("JSON lines")
struct JSONTests {
    @Test("escaping, numbers and field order")
    func serialization() {
        let value = JSONValue.object([
            JSONField("event", .string("x\"y\\z\n\u{1}é")), JSONField("n", .integer(-3)), JSONField("ms", .number(1.5)),
            JSONField("whole", .number(2)), JSONField("fine", .number(0.0123456)), JSONField("none", .null),
            JSONField("ok", .bool(true)), JSONField("inner", .object([JSONField("a", .milliseconds(.microseconds(1500)))])),
            JSONField("nan", .number(.nan)),
        ])
        #expect(value.serialized == #"{"event":"x\"y\\z\n\u0001é","n":-3,"ms":1.5,"whole":2,"fine":0.012,"none":null,"ok":true,"inner":{"a":1.5},"nan":null}"#)
    }

    @Test("every line is JSON that Foundation can read back")
    func readable() throws {
        let event = ReportEvent("probe", [JSONField("peer", .string("127.0.0.1:5")), JSONField("loss_pct", .number(0))], text: nil)
        let line = event.jsonLine(wallMilliseconds: 1_800_000_000_000)
        let object = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
        #expect(object["event"] as? String == "probe" && object["ts"] as? Int == 1_800_000_000_000 && object["peer"] as? String == "127.0.0.1:5")
    }
}
