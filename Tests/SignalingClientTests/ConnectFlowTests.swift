import Foundation
import Testing
import SignalingProtocol
import SignalingSupport
@testable import SignalingClient
#if canImport(Glibc)
import Glibc
#endif

@Suite("Connect-then-mark flow")
struct ConnectFlowTests {
    @Test("connect returns the session once WELCOME arrived, and the server saw our HELLO")
    func success() throws {
        let server = try ScriptedServer()
        let test = try TestClient(port: server.port)
        let serverSide = Thread.runAsync { try server.acceptSession(sessionID: SessionID(high: 7, low: 9), keepAlive: 900) }
        let info = try test.client.connect(timeout: .seconds(5))
        let (_, hello) = try serverSide.value()
        #expect(info.sessionID == SessionID(high: 7, low: 9))
        #expect(info.keepAliveInterval == .seconds(900))
        #expect(info.remoteAddress.port == server.port)
        #expect(hello.userID == "alice" && hello.deviceID == "phone" && hello.resume == nil)
        #expect(hello.requestedKeepAliveSeconds == 0)
        test.settle()
        #expect(test.client.status.sessionID == SessionID(high: 7, low: 9))
        #expect(test.recorder.all.contains { $0.isConnected })
        // Connecting again while connected returns the same session without a new attempt.
        #expect(try test.client.connect(timeout: .seconds(1)).sessionID == info.sessionID)
        test.client.shutdown()
    }

    @Test("a listener that never answers: connect times out within its deadline and leaves nothing behind")
    func timeoutAgainstSilentListener() throws {
        let server = try ScriptedServer()  // listens, never accepts, never answers
        let test = try TestClient(port: server.port)
        let started = Date()
        #expect(throws: ConnectError.timedOut) { try test.client.connect(timeout: .milliseconds(300)) }
        let elapsed = Date().timeIntervalSince(started)
        // Promptly: the deadline plus the cancellation hand-shake, never the 10 s default.
        #expect(elapsed >= 0.29 && elapsed < 2.5, "returned after \(elapsed) s")

        // The background thread has released the lock and ended...
        let attempt = try #require(test.core.queue.sync { test.core.lastAttempt })
        #expect(attempt.threadFinished)
        #expect(attempt.lock.try(), "no thread may still hold the attempt's lock")
        attempt.lock.unlock()
        // ...and its socket is closed: the server side, accepted now, reads HELLO then EOF.
        let peer = try server.accept(within: .seconds(2))
        let frames = try peer.waitForClose(within: .seconds(2))
        #expect(frames.allSatisfy { $0.type == .hello })
        test.client.shutdown()
    }

    @Test("a refused connection fails at once with .refused, well before the deadline")
    func refused() throws {
        let reserved = try ReservedPort()
        let port = reserved.port
        let test = try TestClient(port: port)
        defer { test.client.shutdown() }
        let started = Date()
        do {
            try test.client.connect(timeout: .seconds(5))
            Issue.record("connect succeeded against a closed port")
        } catch {
            guard case .refused(let address) = error else { Issue.record("expected .refused, got \(error)"); return }
            #expect(address.port == port)
        }
        #expect(Date().timeIntervalSince(started) < 4)
        test.settle()
        // The client keeps wanting a connection: it waits for its back-off.
        #expect(test.recorder.wait(within: 2) { $0.contains { $0.isWaiting } })
        test.client.shutdown()
    }

    @Test("a server that answers HELLO with CLOSE unauthorized: .rejected, and the client stops")
    func handshakeRejected() throws {
        let server = try ScriptedServer()
        let test = try TestClient(port: server.port)
        let serverSide = Thread.runAsync { () throws -> Hello in
            let peer = try server.accept()
            let hello = try peer.expectHello()
            try peer.send(.close(Close(code: .unauthorized, message: "bad token")))
            peer.close()
            return hello
        }
        do {
            try test.client.connect(timeout: .seconds(5))
            Issue.record("connect succeeded")
        } catch {
            #expect(error == .rejected(Close(code: .unauthorized, message: "bad token")))
            #expect(!error.isRetryable)
        }
        _ = try serverSide.value()
        #expect(test.recorder.wait { events in
            events.contains { if case .connectionStateChanged(.stopped(.serverRefused(let close))) = $0 { return close.code == .unauthorized } else { return false } }
        })
        test.client.shutdown()
    }

    @Test("garbage instead of WELCOME is a protocol violation, a silent close is reported as such")
    func handshakeGarbageAndClose() throws {
        let server = try ScriptedServer()
        let test = try TestClient(port: server.port)
        let garbage = Thread.runAsync { () throws in
            let peer = try server.accept()
            _ = try peer.expectHello()
            try peer.sendRaw(Array("HTTP/1.1 400 Bad Request\r\n\r\n".utf8))
            _ = try? peer.waitForClose()
        }
        do {
            try test.client.connect(timeout: .seconds(5))
            Issue.record("connect succeeded")
        } catch {
            guard case .protocolViolation = error else { Issue.record("got \(error)"); return }
        }
        try garbage.value()
        test.client.shutdown()

        let closingServer = try ScriptedServer()
        let second = try TestClient(port: closingServer.port)
        let closing = Thread.runAsync { () throws in
            let peer = try closingServer.accept()
            _ = try peer.expectHello()
            peer.close()
        }
        #expect(throws: ConnectError.closedDuringHandshake) { try second.client.connect(timeout: .seconds(5)) }
        try closing.value()
        second.client.shutdown()
    }

    @Test("a frame length over the limit during the handshake is refused without allocating it")
    func handshakeHugeLength() throws {
        let server = try ScriptedServer()
        let test = try TestClient(port: server.port)
        let serverSide = Thread.runAsync { () throws in
            let peer = try server.accept()
            _ = try peer.expectHello()
            try peer.sendRaw([0xFF, 0xFF, 0xFF, 0xFF, 0x02])
            _ = try? peer.waitForClose()
        }
        do {
            try test.client.connect(timeout: .seconds(5))
            Issue.record("connect succeeded")
        } catch {
            guard case .protocolViolation(let message) = error else { Issue.record("got \(error)"); return }
            #expect(message.contains("frameTooLarge"))
        }
        try serverSide.value()
        test.client.shutdown()
    }

    @Test("a refused resume point is retried fresh within the same attempt")
    func resumeRefusedGoesFresh() throws {
        let server = try ScriptedServer()
        let test = try TestClient(port: server.port)
        let first = Thread.runAsync { try server.acceptSession(sessionID: SessionID(high: 1, low: 2)) }
        try test.client.connect(timeout: .seconds(5))
        let (peer, _) = try first.value()
        // The server forgets the session and drops the connection.
        let second = Thread.runAsync { () throws -> (Hello, Hello) in
            peer.reset()
            let resumeTry = try server.accept()
            let resumeHello = try resumeTry.expectHello()
            try resumeTry.send(.close(Close(code: .sessionUnknown, message: "expired")))
            resumeTry.close()
            let (_, freshHello) = try server.acceptSession(sessionID: SessionID(high: 3, low: 4))
            return (resumeHello, freshHello)
        }
        let (resumeHello, freshHello) = try second.value()
        #expect(resumeHello.resume?.sessionID == SessionID(high: 1, low: 2))
        #expect(freshHello.resume == nil)
        #expect(test.recorder.wait { $0.contains { $0.connectedSession?.sessionID == SessionID(high: 3, low: 4) } })
        test.client.shutdown()
    }

    @Test("a connect called while an automatic attempt runs joins it instead of opening a second socket")
    func concurrentConnectsShareOneAttempt() throws {
        let server = try ScriptedServer()
        let test = try TestClient(port: server.port)
        let results = Thread.runAsync { () throws -> [SessionInfo] in
            let group = DispatchGroup()
            let collected = LockedBox<[Result<SessionInfo, ConnectError>]>([])
            for _ in 0..<3 {
                group.enter()
                // Real threads, not the global queue: the test runner's own threads are
                // global-queue threads and may all be blocked in other tests.
                Thread.detachNewThread {
                    let result = Result { () throws(ConnectError) in try test.client.connect(timeout: .seconds(5)) }
                    collected.mutate { $0.append(result) }
                    group.leave()
                }
            }
            group.wait()
            return try collected.value.map { try $0.get() }
        }
        let (peer, _) = try server.acceptSession(sessionID: SessionID(high: 5, low: 5))
        defer { withExtendedLifetime(peer) {} }
        let sessions = try results.value()
        #expect(sessions.count == 3)
        #expect(Set(sessions.map(\.sessionID)) == [SessionID(high: 5, low: 5)])
        // No second connection was opened.
        if let extra = try? server.accept(within: .milliseconds(200)) {
            Issue.record("a second connection was opened: \(String(describing: try? extra.readFrame(within: .seconds(1)))) events: \(test.recorder.all)")
        }
        test.client.shutdown()
    }

    @Test("bad arguments are errors, not crashes")
    func badInput() throws {
        #expect(throws: ClientConfigurationError.self) {
            try SignalingClient(configuration: ClientConfiguration(host: "127.0.0.1", port: 1, userID: "", deviceID: "d")) { _ in }
        }
        #expect(throws: ClientConfigurationError.self) {
            try SignalingClient(configuration: ClientConfiguration(host: "127.0.0.1", port: 1, userID: "a\u{1}", deviceID: "d")) { _ in }
        }
        #expect(throws: ClientConfigurationError.self) {
            var configuration = ClientConfiguration(host: "127.0.0.1", port: 1, userID: "a", deviceID: "d")
            configuration.requestedKeepAliveSeconds = 599
            return try SignalingClient(configuration: configuration) { _ in }
        }
        let test = try TestClient(port: 1)
        #expect(throws: ConnectError.invalidTimeout) { try test.client.connect(timeout: .zero) }
        test.client.shutdown()
        #expect(throws: ConnectError.clientShutDown) { try test.client.connect(timeout: .seconds(1)) }
        let unresolvable = try TestClient(port: 1, host: "no-such-host.invalid")
        #expect(throws: ConnectError.self) { try unresolvable.client.connect(timeout: .seconds(5)) }
        unresolvable.client.shutdown()
    }
}

/// A value produced on another thread.
final class AsyncValue<T>: @unchecked Sendable {
    private let condition = NSCondition()
    private var result: Result<T, any Error>?

    func set(_ result: Result<T, any Error>) {
        condition.lock(); self.result = result; condition.broadcast(); condition.unlock()
    }

    /// Waits (with a deadline) for the value; rethrows the thread's error.
    func value(within timeout: TimeInterval = 15) throws -> T {
        let deadline = Date(timeIntervalSinceNow: timeout)
        condition.lock()
        defer { condition.unlock() }
        while result == nil {
            if !condition.wait(until: deadline) { throw FixtureError("background work did not finish in \(timeout) s") }
        }
        return try result!.get()
    }
}

extension Thread {
    /// Runs `body` on a new thread (server scripts run beside a blocking connect).
    static func runAsync<T>(_ body: @escaping @Sendable () throws -> T) -> AsyncValue<T> {
        let value = AsyncValue<T>()
        Thread.detachNewThread { value.set(Result { try body() }) }
        return value
    }
}

final class LockedBox<T>: @unchecked Sendable {
    private let lock = NSLock()
    private var stored: T
    init(_ value: T) { stored = value }
    var value: T { lock.lock(); defer { lock.unlock() }; return stored }
    func mutate(_ body: (inout T) -> Void) { lock.lock(); body(&stored); lock.unlock() }
}

/// A loopback port that is bound (so no other test can get it) but not listening:
/// connecting to it is refused.
final class ReservedPort {
    let descriptor: Int32
    let port: UInt16

    init() throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        let address = try SocketAddress.resolve(host: "127.0.0.1", port: 0)[0]
        guard address.withSockaddr({ bind(fd, $0, $1) }) == 0 else { close(fd); throw FixtureError("bind: \(errno)") }
        descriptor = fd
        port = SocketHandle(descriptor: dup(fd)).localAddress()!.port
    }

    deinit { close(descriptor) }
}
