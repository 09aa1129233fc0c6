import SignalingProtocol
@testable import SignalingServer
import SignalingStore
import SignalingSupport
import Synchronization
import TestSupport
import Testing

/// A home played by the test on a `LocalNodeBus`: it listens as a lease owner id, records
/// every relay packet it gets, and sends frames to the front.
final class TestHome: Sendable {
    let link: LocalNodeLink
    let name: String
    private let packets = Mutex<[RelayPacket]>([])

    /// - Parameter listening: listens as `name` at once (else the test calls `link.listen(as:)`).
    init(bus: LocalNodeBus, name: String, listening: Bool = true) {
        link = bus.makeLink(named: "home")
        self.name = name
        link.start { [weak self] event in
            guard case .packet(let bytes) = event, let packet = try? RelayPacket(decoding: bytes) else { return }
            self?.packets.withLock { $0.append(packet) }
        }
        if listening { link.listen(as: name) }
    }

    var received: [RelayPacket] { packets.withLock { $0 } }
    var frames: [RelayPacket.Frame] { received.flatMap(\.frames) }

    /// Sends `frames` to the front (to its node id, the packets' `from`).
    func send(_ frames: [RelayPacket.Frame], to front: String) {
        link.send(RelayPacket(from: link.nodeID, frames: frames).encoded(), to: front)
    }

    /// Waits (real time, 10 s) until the frames received satisfy `condition`.
    func waitFor(_ what: String, _ condition: ([RelayPacket.Frame]) -> Bool) throws {
        let clock = SystemClock()
        let deadline = clock.now() + .seconds(10)
        while clock.now() < deadline {
            if condition(frames) { return }
            clock.sleep(until: clock.now() + .milliseconds(2))
        }
        throw TestFailure("the home never got \(what); it got \(frames)")
    }

    /// Waits for the `.open` of a new connection (the `index`-th open) and returns it.
    func waitForOpen(_ index: Int = 0) throws -> (connection: UInt64, peer: String, tls: Bool) {
        var found: (UInt64, String, Bool)?
        try waitFor("open #\(index)") { frames in
            let opens = frames.compactMap { frame -> (UInt64, String, Bool)? in
                if case .open(let connection, let peer, let tls) = frame { return (connection, peer, tls) }
                return nil
            }
            found = opens.count > index ? opens[index] : nil
            return found != nil
        }
        return found!
    }

    /// Everything the device sent on `connection`, concatenated.
    func bytes(of connection: UInt64) -> [UInt8] {
        frames.flatMap { frame -> [UInt8] in
            if case .data(connection, let bytes) = frame { return bytes }
            return []
        }
    }

    func stop() { link.stop() }
}

/// A front server (a `SignalingServer` whose loops relay) on a local bus, with a test home.
final class FrontFixture {
    let bus = LocalNodeBus()
    let link: LocalNodeLink
    let relay: FrontRelay
    let home: TestHome
    let server: SignalingServer

    init(clock: any Clock = SystemClock(), connectionSlotsPerLoop: Int? = nil, _ configure: (inout ServerConfiguration) -> Void = { _ in }) throws {
        link = bus.makeLink(named: "front")
        relay = FrontRelay(link: link)
        home = TestHome(bus: bus, name: "lease-owner-1")
        link.start { [relay] in relay.receive($0) }
        relay.setHome(home.name)
        var configuration = ServerConfiguration()
        configuration.host = "127.0.0.1"
        configuration.port = 0
        configuration.workers = 2
        configuration.tickInterval = .milliseconds(5)
        configuration.drainTimeout = .seconds(1)
        configure(&configuration)
        server = try SignalingServer(configuration: configuration, clock: clock, logger: .silent, front: relay)
        if let connectionSlotsPerLoop { server.connectionSlotsPerLoop.store(connectionSlotsPerLoop, ordering: .relaxed) }
        try server.start()
        try eventually("the link is up") { relay.unavailableReason == nil }
    }

    deinit {
        server.shutdown()
        link.stop()
        home.stop()
    }

    func eventually(_ what: String, _ condition: () -> Bool) throws {
        guard TestSupport.eventually(10, condition) else { throw TestFailure("never: \(what)") }
    }

    func device(receiveWindow: Int32? = nil, proxyHeader: [UInt8]? = nil, tls: TestTLS? = nil, port: UInt16? = nil) throws -> TestClient {
        try TestClient(port: port ?? server.port, receiveWindow: receiveWindow, proxyHeader: proxyHeader, tls: tls)
    }

    /// The home's frames for `connection`: whole protocol frames, as a home sends them.
    func sendFrames(_ frames: [Frame], to connection: UInt64, then more: [RelayPacket.Frame] = []) {
        let bytes = frames.flatMap { FrameEncoder.encode($0) }
        home.send([.data(connection: connection, bytes: bytes)] + more, to: link.nodeID)
    }
}

/// Numbered frames a home might send, to check order.
func numberedReplies(_ count: Int) -> [Frame] {
    (1...count).map { Frame.error(requestID: UInt32($0), code: .internalError, message: "reply \($0)") }
}

/// Reads frames until the stream ends; throws on timeout.
func readToEnd(_ device: TestClient, timeout: Duration = .seconds(20)) throws -> [Frame] {
    var frames: [Frame] = []
    while let frame = try device.read(timeout: timeout) { frames.append(frame) }
    return frames
}

func closeCode(_ frame: Frame?) -> CloseCode? {
    if case .close(let close)? = frame { return close.code }
    return nil
}

@Suite("Front: a node relays its devices' bytes to the home", .serialized)
struct FrontTests {
    @Test("bytes go both ways in order: the home gets .reset, .open, the device's bytes as sent; the device gets the home's frames")
    func relaysBothWays() throws {
        let front = try FrontFixture()
        let device = try front.device()
        let open = try front.home.waitForOpen()
        #expect(!open.tls)
        #expect(open.peer.hasPrefix("127.0.0.1:"), "\(open.peer)")
        #expect(front.home.received.first?.frames.first == .reset, "the first packet to a home begins with .reset")

        let hello = FrameEncoder.encode(.hello(Hello(userID: "alice", deviceID: "d1")))
        let sent = hello + FrameEncoder.encode(.ping) + FrameEncoder.encode(.ping)
        try device.sendRaw(Array(sent[..<7]))
        try device.sendRaw(Array(sent[7...]))
        try front.home.waitFor("the device's bytes") { _ in front.home.bytes(of: open.connection).count == sent.count }
        #expect(front.home.bytes(of: open.connection) == sent)

        let replies = numberedReplies(200)
        for chunk in stride(from: 0, to: replies.count, by: 50) {
            front.sendFrames(Array(replies[chunk..<chunk + 50]), to: open.connection)
        }
        for expected in replies {
            #expect(try device.read(timeout: .seconds(10)) == expected)
        }
    }

    @Test(".finish: the device reads everything the home sent, then the end of the stream")
    func finishWritesThenEnds() throws {
        let front = try FrontFixture()
        let device = try front.device()
        let open = try front.home.waitForOpen()
        let frames = numberedReplies(100) + [.close(Close(code: .idleTimeout, message: "nothing received"))]
        front.sendFrames(frames, to: open.connection, then: [.finish(connection: open.connection)])
        #expect(try readToEnd(device) == frames)
    }

    @Test(".release closes the device at once; a device that closes its socket is .closed to the home")
    func releaseAndClosed() throws {
        let front = try FrontFixture()
        let released = try front.device()
        let first = try front.home.waitForOpen(0)
        front.home.send([.release(connection: first.connection)], to: front.link.nodeID)
        #expect(try readToEnd(released).isEmpty, "released: no CLOSE from the front, the stream just ends")

        var leaving: TestClient? = try front.device()
        let second = try front.home.waitForOpen(1)
        leaving = nil
        _ = leaving
        try front.home.waitFor(".closed of the device that left") { $0.contains(.closed(connection: second.connection)) }
        #expect(!front.home.frames.contains(.closed(connection: first.connection)), "the home forgot the released one: no .closed")
    }

    @Test("the link goes down: every relayed device gets CLOSE goingAway with the drain's advice; new ones too until it is up, then .reset comes first")
    func linkDown() throws {
        let front = try FrontFixture { $0.drainRetryAfter = .seconds(3) }
        let device = try front.device()
        _ = try front.home.waitForOpen()
        front.bus.cut(front.link)
        let frames = try readToEnd(device)
        #expect(frames.count == 1 && closeCode(frames.first) == .goingAway, "\(frames)")
        if case .close(let close)? = frames.first { #expect(close.retryAfterMs == 3_000) }
        try front.eventually("/readyz turns 503") { !front.server.readiness.isReady }

        let refused = try front.device()
        #expect(closeCode(try readToEnd(refused).first) == .goingAway)

        front.bus.restore(front.link)
        try front.eventually("/readyz turns 200") { front.server.readiness.isReady }
        let before = front.home.received.count
        _ = try front.device()
        _ = try front.home.waitForOpen(1)
        let after = Array(front.home.received[before...])
        #expect(after.first?.frames.first == .reset, "\(after)")
    }

    @Test("the home changes: relayed devices get CLOSE goingAway, and the new home gets .reset before its first .open")
    func homeChanges() throws {
        let front = try FrontFixture()
        let device = try front.device()
        _ = try front.home.waitForOpen()
        let newHome = TestHome(bus: front.bus, name: "lease-owner-2")
        defer { newHome.stop() }
        front.relay.setHome(newHome.name)
        #expect(closeCode(try readToEnd(device).first) == .goingAway)

        let next = try front.device()
        let open = try newHome.waitForOpen()
        #expect(newHome.received.first?.frames.prefix(2) == [.reset, .open(connection: open.connection, peer: open.peer, tls: false)])
        front.sendFrames([.pong], to: open.connection)
        #expect(try next.read(timeout: .seconds(10)) == .pong)

        front.relay.setHome(nil)
        try front.eventually("/readyz turns 503 without a home") { front.server.readiness.noRoute != nil }
        #expect(closeCode(try readToEnd(next).first) == .goingAway)
        #expect(closeCode(try readToEnd(try front.device()).first) == .goingAway, "no home: a new device is refused")
    }

    @Test("a packet for the home comes back undeliverable (it stopped listening): relayed devices get CLOSE goingAway")
    func undeliverable() throws {
        let front = try FrontFixture()
        let device = try front.device()
        _ = try front.home.waitForOpen()
        front.home.link.stopListening(as: front.home.name)
        try device.send(.ping)
        #expect(closeCode(try readToEnd(device).first) == .goingAway)
    }

    @Test("a home that does not listen yet: new devices are held, nothing is sent to it; once it listens each is announced with the bytes it sent meanwhile")
    func heldUntilTheHomeListens() throws {
        let front = try FrontFixture()
        let newHome = TestHome(bus: front.bus, name: "lease-owner-2", listening: false)
        defer { newHome.stop() }
        front.relay.setHome(newHome.name)
        try front.eventually("/readyz says the home does not listen") {
            front.relay.unavailableReason?.contains("does not listen") == true
        }
        let talking = try front.device()
        let hello = FrameEncoder.encode(.hello(Hello(userID: "alice", deviceID: "d1")))
        try talking.sendRaw(Array(hello[..<5]))
        try talking.sendRaw(Array(hello[5...]))
        let silent = try front.device()
        try front.eventually("both devices are accepted") { front.server.openConnectionsPerLoop.reduce(0, +) == 2 }
        front.relay.setHome(newHome.name)  // a poll: the home still does not listen
        #expect(try silent.staysSilent(), "a held device is not closed")
        #expect(newHome.received.isEmpty, "nothing is sent to a home that does not listen")

        newHome.link.listen(as: newHome.name)
        front.relay.setHome(newHome.name)  // the lease thread's next poll asks the link
        _ = try newHome.waitForOpen(1)
        #expect(newHome.received.first?.frames.first == .reset)
        let opens = newHome.frames.compactMap { frame -> UInt64? in
            if case .open(let connection, _, _) = frame { return connection }
            return nil
        }
        try newHome.waitFor("alice's HELLO, as she sent it") { _ in opens.contains { newHome.bytes(of: $0) == hello } }
        let alice = try #require(opens.first { newHome.bytes(of: $0) == hello })
        front.sendFrames([.pong], to: alice)
        #expect(try talking.read(timeout: .seconds(10)) == .pong, "the held device is relayed, not closed")
        let other = try #require(opens.first { $0 != alice })
        front.sendFrames([.pong], to: other)
        #expect(try silent.read(timeout: .seconds(10)) == .pong)
    }

    @Test("a device held while the home does not listen gets CLOSE goingAway with the drain's advice at its handshake deadline, and the home hears nothing of it")
    func heldPastItsDeadline() throws {
        let clock = ManualClock()
        let front = try FrontFixture(clock: clock) {
            $0.handshakeTimeout = .seconds(10)
            $0.drainRetryAfter = .seconds(3)
        }
        let newHome = TestHome(bus: front.bus, name: "lease-owner-2", listening: false)
        defer { newHome.stop() }
        front.relay.setHome(newHome.name)
        try front.eventually("the route waits for the home") { front.relay.unavailableReason?.contains("does not listen") == true }
        let device = try front.device()
        try device.send(.hello(Hello(userID: "alice", deviceID: "d1")))
        try front.eventually("the device is accepted") { front.server.openConnectionsPerLoop.reduce(0, +) == 1 }
        clock.advance(by: .seconds(11))
        let frames = try readToEnd(device)
        #expect(frames.count == 1 && closeCode(frames.first) == .goingAway, "\(frames)")
        if case .close(let close)? = frames.first {
            #expect(close.retryAfterMs == 3_000 && close.message.contains("did not listen"), "\(close)")
        }
        #expect(front.server.statistics.handshakeTimeouts == 0, "the device was not slow: the route was")
        newHome.link.listen(as: newHome.name)
        front.relay.setHome(newHome.name)
        try front.eventually("the route is ready") { front.relay.unavailableReason == nil }
        #expect(newHome.received.isEmpty, "the closed device is never announced")
    }

    @Test("a device that does not read while the home sends more than --max-queued-bytes: CLOSE slowConsumer by the front, .closed to the home")
    func slowConsumerOverTheBound() throws {
        let front = try FrontFixture { $0.maxQueuedBytes = 256 << 10 }
        let device = try front.device(receiveWindow: 4096)
        let open = try front.home.waitForOpen()
        let frame = Frame.error(requestID: 1, code: .internalError, message: String(repeating: "x", count: 60_000))
        for _ in 0..<200 { front.sendFrames([frame], to: open.connection) }
        try front.home.waitFor(".closed") { $0.contains(.closed(connection: open.connection)) }
        let frames = try readToEnd(device, timeout: .seconds(30))
        #expect(closeCode(frames.last) == .slowConsumer, "\(frames.count) frames, the last \(String(describing: frames.last).prefix(80))")
        #expect(front.server.statistics.slowConsumerCloses == 1)
    }

    @Test("a device that reads nothing for --slow-consumer-timeout while the home's bytes wait: CLOSE slowConsumer, .closed to the home")
    func slowConsumerTimeout() throws {
        let clock = ManualClock()
        let front = try FrontFixture(clock: clock) {
            $0.maxQueuedBytes = 64 << 20
            $0.slowConsumerTimeout = .seconds(30)
        }
        let device = try front.device(receiveWindow: 4096)
        let open = try front.home.waitForOpen()
        let frame = Frame.error(requestID: 1, code: .internalError, message: String(repeating: "y", count: 60_000))
        for _ in 0..<200 { front.sendFrames([frame], to: open.connection) }  // 12 MB: more than the kernel buffers
        try front.eventually("bytes wait in the front") { front.server.statistics.largestOutbound > 1 << 20 }
        #expect(!front.home.frames.contains(.closed(connection: open.connection)))
        // The socket may still take bytes after the clock moved (the kernel grows its
        // buffers; the last relayed frames arrive): each write that takes some counts as
        // progress and restarts the 30 s. Once the buffers are full nothing moves, so a
        // device that never reads is closed within a few 32 s steps, not at the first.
        let system = SystemClock()
        for _ in 0..<8 where !front.home.frames.contains(.closed(connection: open.connection)) {
            clock.advance(by: .seconds(32))
            let deadline = system.now() + .milliseconds(500)
            while system.now() < deadline && !front.home.frames.contains(.closed(connection: open.connection)) {
                system.sleep(until: system.now() + .milliseconds(2))
            }
        }
        try front.home.waitFor(".closed") { $0.contains(.closed(connection: open.connection)) }
        let frames = try readToEnd(device, timeout: .seconds(30))
        #expect(closeCode(frames.last) == .slowConsumer)
    }

    @Test("a TLS device through a front: relayed as plain bytes with tls: true")
    func tlsDevice() throws {
        let certificates = try TestCertificates()
        let front = try FrontFixture { TestServer.tls(certificates, &$0) }
        let device = try front.device(tls: try TestTLS(caFile: certificates.caFile), port: front.server.tlsPort)
        let open = try front.home.waitForOpen()
        #expect(open.tls)
        try device.send(.ping)
        try front.home.waitFor("the ping") { _ in front.home.bytes(of: open.connection) == FrameEncoder.encode(.ping) }
        front.sendFrames([.pong], to: open.connection)
        #expect(try device.read(timeout: .seconds(10)) == .pong)
    }

    @Test("a PROXY header: the device's address from it is the .open's peer, and only the bytes behind it are relayed")
    func proxyHeaderPeer() throws {
        let front = try FrontFixture { $0.proxyProtocol = true }
        let header = ProxyHeaderBytes.ipv4("203.0.113.7", port: 40123)
        let device = try front.device(proxyHeader: Array(header[..<9]))
        try device.sendRaw(Array(header[9...]) + FrameEncoder.encode(.ping))
        let open = try front.home.waitForOpen()
        #expect(open.peer == "203.0.113.7:40123")
        try front.home.waitFor("the ping") { _ in front.home.bytes(of: open.connection) == FrameEncoder.encode(.ping) }
    }

    @Test("a home that never answers: the handshake deadline closes the device (CLOSE handshakeTimeout) and tells the home")
    func homeNeverAnswers() throws {
        let clock = ManualClock()
        let front = try FrontFixture(clock: clock) { $0.handshakeTimeout = .seconds(10) }
        let device = try front.device()
        let open = try front.home.waitForOpen()
        try device.send(.ping)
        try front.home.waitFor("the ping") { _ in !front.home.bytes(of: open.connection).isEmpty }
        clock.advance(by: .seconds(11))
        #expect(closeCode(try readToEnd(device).first) == .handshakeTimeout)
        try front.home.waitFor(".closed") { $0.contains(.closed(connection: open.connection)) }
    }

    @Test("a front's drain closes its devices with CLOSE goingAway and tells the home")
    func drain() throws {
        let front = try FrontFixture()
        let device = try front.device()
        let open = try front.home.waitForOpen()
        front.server.beginShutdown()
        #expect(closeCode(try readToEnd(device).first) == .goingAway)
        try front.home.waitFor(".closed") { $0.contains(.closed(connection: open.connection)) }
    }
}
