import SignalingProtocol
@testable import SignalingServer
import SignalingSupport
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// Delivery is driven by the socket's writability: a device's backlog stays in its queue
/// and is encoded only as fast as the socket takes it, so a reader that keeps up gets any
/// backlog on one connection, and only a client that reads nothing for the slow-consumer
/// timeout is closed, with CLOSE slowConsumer. Over real sockets: backlogs larger than the
/// kernel's buffers; the slow-consumer rules are on embedded loops
/// (EmbeddedBackpressureTests), where a stall starts at a known moment.
@Suite("Back-pressure over real sockets")
struct BackpressureTests {
    static let bodySize = LargeMessages.size

    /// How long the server says the socket had taken nothing when it closed it ("nothing
    /// read for N s while ..."): the server's own second stamps, so the check is exact
    /// whenever the kernel took its last bytes.
    static func stalledSeconds(_ close: Close) -> Int? {
        guard close.message.hasPrefix("nothing read for ") else { return nil }
        return Int(close.message.dropFirst("nothing read for ".count).prefix { $0.isNumber })
    }

    @Test("a 50 MB backlog reaches a device that reads at full speed, whole, on one connection, acknowledged only at the end")
    func largeBacklogOnOneConnection() throws {
        let server = try TestServer()
        let count = 50_000_000 / Self.bodySize + 1
        do { _ = try server.connect(user: "bob") }  // bob has a device, now offline
        try server.waitFor("bob to go") { $0.establishedConnections == 0 }
        let (alice, _) = try server.connect(user: "alice")
        for index in 1...count { try alice.send(.request(id: UInt32(index), LargeMessages.request(index, to: "bob"))) }
        for index in 1...count { #expect(try alice.reply(to: UInt32(index), timeout: .seconds(30)).isOK) }

        let (bob, welcome) = try server.connect(user: "bob")
        #expect(welcome.ackedSeq == 0)
        let last = try bob.receiveLargeMessages(count: count)
        try bob.ack(last)
        // Acknowledged at the end, the connection still open: nothing was dropped or closed.
        for _ in 1...count { guard case .messageDelivered = try alice.nextEvent(timeout: .seconds(30)).event else { return } }
        #expect(bob.isOpenAndQuiet)
        let statistics = server.server.statistics
        #expect(statistics.slowConsumerCloses == 0)
        #expect(statistics.largestOutbound <= EventLoop.pumpBytes + Self.bodySize + 1024,
                "only about one batch is ever encoded ahead of the socket")
    }

    @Test("a burst pipelined to a connected device that reads at full speed is delivered whole")
    func pipelinedBurstToAFastReader() throws {
        let server = try TestServer()
        let (bob, _) = try server.connect(user: "bob")
        let (alice, _) = try server.connect(user: "alice")
        let count = 200
        var burst: [UInt8] = []
        for index in 1...count { FrameEncoder.append(.request(id: UInt32(index), LargeMessages.request(index, to: "bob")), to: &burst) }
        try alice.sendRaw(burst)
        let last = try bob.receiveLargeMessages(count: count)
        try bob.ack(last)
        for index in 1...count { #expect(try alice.reply(to: UInt32(index), timeout: .seconds(30)).isOK) }
        #expect(bob.isOpenAndQuiet)
        #expect(server.server.statistics.slowConsumerCloses == 0)
    }
}

/// The same rule in the real executable, where the server's own memory can be measured.
@Suite("Back-pressure (voipserver subprocess)")
struct BackpressureProcessTests {
    static func residentBytes(of pid: pid_t) -> Int {
        let status = (try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)) ?? ""
        guard let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") }) else { return 0 }
        return (Int(line.split(separator: " ")[1]) ?? 0) * 1024
    }

    @Test("a device that never reads is sent CLOSE slowConsumer after --slow-consumer-timeout; meanwhile the server holds its backlog once, not again as output buffers")
    func neverReadingDeviceInTheExecutable() throws {
        let server = try ServerProcess(["--workers", "1", "--store", "memory", "--slow-consumer-timeout", "2"])
        let bob = try TestClient(port: server.port, receiveWindow: 4096)
        _ = try bob.hello(user: "bob")
        let (alice, _) = try { () throws -> (TestClient, Welcome) in
            let client = try TestClient(port: server.port)
            return (client, try client.hello(user: "alice"))
        }()
        let before = BackpressureProcessTests.residentBytes(of: server.process.pid)
        let count = 200, size = BackpressureTests.bodySize
        for index in 1...count { try alice.send(.request(id: UInt32(index), LargeMessages.request(index, to: "bob"))) }
        for index in 1...count { #expect(try alice.reply(to: UInt32(index), timeout: .seconds(30)).isOK) }
        let grown = BackpressureProcessTests.residentBytes(of: server.process.pid) - before
        // The events themselves (12 MB, in the queue until acknowledged), plus slack for
        // the allocator: no second copy as bytes waiting for the socket.
        #expect(grown < count * size + 4 << 20, "RSS grew by \(grown) bytes for \(count * size) bytes of events")

        // Bob reads nothing: after the timeout he is closed, and when he reads at last,
        // what was on its way ends with CLOSE slowConsumer.
        let deadline = SystemClock().now() + .seconds(20)
        while !server.log.contains("event=slow_consumer") {
            guard SystemClock().now() < deadline else { throw TestClient.Failure("no slow_consumer line: \(server.log)") }
            usleep(20_000)
        }
        #expect(server.log.contains("level=warn event=slow_consumer"))
        let close = try bob.expect(timeout: .seconds(20), "CLOSE") { frame -> Close? in
            if case .close(let close) = frame { return close }
            return nil
        }
        #expect(close.code == .slowConsumer)
    }
}

/// The slow-consumer rules on embedded loops: a connection's receive window is exact, so
/// the moment writes stop being taken is known, and the close is checked to the second
/// instead of by moving the clock until it happens.
@Suite("Back-pressure and slow consumers (embedded loops)")
struct EmbeddedBackpressureTests {
    @Test("a client that pipelines requests and reads nothing is held back, not buffered, then closed with CLOSE slowConsumer once the timeout has passed; its events stay pending")
    func neverReadingClientIsClosedWithSlowConsumer() throws {
        let server = try EmbeddedServer {
            $0.maxFrameLength = 1024
            $0.maxQueuedBytes = 4096
            $0.slowConsumerTimeout = .seconds(30)
        }
        let (alice, _) = try server.connect(user: "alice")
        let reader = try server.client(receiveWindow: 4096)
        let welcome = try reader.hello(user: "bob")
        #expect(try alice.request(1, .messageSend(OutgoingMessage(messageID: "m1", recipient: "bob", contentType: "t", body: [1]))).isOK)
        // 150 KB of PINGs (more than a read) without reading a single PONG: the server
        // stops reading us, and the rest stays with the client (in TCP's buffers).
        try reader.sendRaw((0..<30_000).flatMap { _ in FrameEncoder.encode(.ping) })
        #expect(!reader.socket.toServer.isEmpty, "the server read everything")
        #expect(server.statistics.largestOutbound <= 4096 + 1024, "replies beyond --max-queued-bytes were buffered")

        // The socket took its last bytes at second 0; rounded down, so closed at 31 s.
        server.advance(by: .seconds(30))
        #expect(server.statistics.slowConsumerCloses == 0, "closed before the timeout")
        server.advance(by: .seconds(1))
        #expect(server.statistics.slowConsumerCloses == 1)
        // What it had not read is still readable, and ends with CLOSE slowConsumer.
        let close = try reader.expectClose()
        #expect(close.code == .slowConsumer && close.action == .resume)
        #expect(BackpressureTests.stalledSeconds(close) == 31, "\(close.message)")
        #expect(close.retryAfterMs == 1_000 && close.retryJitterMs == 5_000)

        // The message it never acknowledged is still there for its next connection.
        let again = try server.client()
        #expect(try again.hello(user: "bob", resume: ResumePoint(sessionID: welcome.sessionID, lastReceivedSeq: 0)).resumed)
        guard case .message(let message) = try again.nextEvent().event else { Issue.record("event lost"); return }
        #expect(message.messageID == "m1")
    }

    @Test("a device that stops reading its events is closed with CLOSE slowConsumer after the timeout, not before; while it waits only one batch is buffered")
    func stalledEventReaderIsClosedAfterTheTimeout() throws {
        let server = try EmbeddedServer { $0.slowConsumerTimeout = .seconds(10) }
        let reader = try server.client(receiveWindow: 4096)
        let welcome = try reader.hello(user: "bob")
        let (alice, _) = try server.connect(user: "alice")
        let count = 20
        for index in 1...count { #expect(try alice.request(UInt32(index), LargeMessages.request(index, to: "bob")).isOK) }
        #expect(server.statistics.largestOutbound > 0, "no bytes wait for bob")
        #expect(server.statistics.largestOutbound <= EventLoop.pumpBytes + BackpressureTests.bodySize + 1024)

        server.advance(by: .seconds(10))
        #expect(server.statistics.slowConsumerCloses == 0, "closed before the timeout")
        server.advance(by: .seconds(1))
        #expect(server.statistics.slowConsumerCloses == 1)
        // It reads again: the events that were on their way, then CLOSE.
        var received = 0
        let close = try reader.expect("CLOSE") { frame -> Close? in
            if case .event = frame { received += 1 }
            if case .close(let close) = frame { return close }
            return nil
        }
        #expect(close.code == .slowConsumer)
        #expect(BackpressureTests.stalledSeconds(close) == 11, "\(close.message)")
        #expect(received > 0 && received < count)
        // Resumed, it gets the rest.
        let again = try server.client()
        _ = try again.hello(user: "bob", resume: ResumePoint(sessionID: welcome.sessionID, lastReceivedSeq: UInt64(received)))
        for expected in (received + 1)...count { #expect(try again.nextEvent().seq == UInt64(expected)) }
    }
}
