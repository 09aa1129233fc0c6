import Foundation
import Testing
import SignalingProtocol
import SignalingSupport
@testable import SignalingClient

@Suite("Requests")
struct RequestTests {
    @Test("bad arguments are refused before anything is sent, with a clear error")
    func invalidArguments() throws {
        let pair = try ConnectedPair()
        defer { pair.shutdown() }
        func outcome(_ body: (@escaping RequestCompletion) -> Void) throws -> RequestError? {
            if case .failure(let error) = try pair.test.request(body) { return error }
            return nil
        }
        let empty = try outcome { pair.client.send(to: "", body: [1], completion: $0) }
        guard case .invalidArgument(let message)? = empty else { Issue.record("got \(String(describing: empty))"); return }
        #expect(message.contains("recipient"))
        let control = try outcome { pair.client.invite(callee: "bob\n", offer: [], completion: $0) }
        guard case .invalidArgument? = control else { Issue.record("got \(String(describing: control))"); return }
        let longID = try outcome { pair.client.send(to: "bob", body: [], messageID: String(repeating: "x", count: 129), completion: $0) }
        guard case .invalidArgument? = longID else { Issue.record("got \(String(describing: longID))"); return }
        let huge = try outcome { pair.client.send(to: "bob", body: [UInt8](repeating: 0, count: 70_000), completion: $0) }
        guard case .invalidArgument(let hugeMessage)? = huge else { Issue.record("got \(String(describing: huge))"); return }
        #expect(hugeMessage.contains("exceeds"))
        let type = try outcome { pair.client.send(to: "bob", contentType: "", body: [], completion: $0) }
        guard case .invalidArgument? = type else { Issue.record("got \(String(describing: type))"); return }
        // None of them reached the server; the connection is fine.
        pair.client.send(to: "bob", body: [1], messageID: "ok-1")
        guard case .request(_, .messageSend(let sent)) = try pair.peer.readFrame() else { Issue.record("expected the valid send"); return }
        #expect(sent.messageID == "ok-1")
    }

    @Test("a retryable refusal keeps the message and sends it again after the retry delay; the completion runs once")
    func retryableErrorIsRetried() throws {
        let clock = ManualClock()
        let pair = try ConnectedPair(clock: clock) { $0.requestRetryDelay = .seconds(2) }
        defer { pair.shutdown() }
        let completions = Collector<Result<RequestAcceptance, RequestError>>()
        pair.client.send(to: "bob", body: [1], messageID: "r-1") { completions.append($0) }
        guard case .request(let firstID, .messageSend) = try pair.peer.readFrame() else { Issue.record("no send"); return }
        try pair.peer.send(.error(requestID: firstID, code: .recipientBacklogFull, message: "full"))
        // No event reports a refusal that will be retried: watch the client's outbox.
        #expect(poll(until: Date(timeIntervalSinceNow: 5)) { pair.core.queue.sync { pair.core.outbox.nextRetry != nil } })
        #expect(completions.value.isEmpty)
        #expect(pair.client.status.pendingRequests == 1)
        pair.test.advance(clock, by: .milliseconds(1_999))
        pair.test.advance(clock, by: .milliseconds(1))
        guard case .request(let secondID, .messageSend(let again)) = try pair.peer.readFrame() else { Issue.record("no retry"); return }
        #expect(again.messageID == "r-1" && secondID != firstID)
        try pair.peer.send(.ok(requestID: secondID, serverTime: 123))
        #expect(completions.wait(forCount: 1))
        pair.test.settle()
        #expect(completions.value == [.success(RequestAcceptance(serverTime: 123))])
        // A non-retryable refusal completes with the error.
        pair.client.send(to: "bob", body: [2], messageID: "r-2") { completions.append($0) }
        guard case .request(let thirdID, .messageSend) = try pair.peer.readFrame() else { Issue.record("no send"); return }
        try pair.peer.send(.error(requestID: thirdID, code: .badRequest, message: "no"))
        #expect(completions.wait(forCount: 2))
        #expect(completions.value.last == .failure(.rejected(.badRequest, message: "no")))
    }

    @Test("shutting down ends pending sends with the unsent message, never silently")
    func shutdownReturnsUnsent() throws {
        let test = try TestClient(port: 9)
        let result = AsyncValue<Result<RequestAcceptance, RequestError>>()
        test.client.send(to: "bob", body: [5], messageID: "u-1") { result.set(.success($0)) }
        test.client.shutdown()
        guard case .failure(.clientShutDown(let unsent)) = try result.value(),
              case .messageSend(let message) = unsent else { Issue.record("expected clientShutDown"); return }
        #expect(message.messageID == "u-1" && message.body == [5])
    }

    @Test("the server's bytes that break the protocol drop the connection and the client backs off")
    func protocolViolationFromServer() throws {
        let pair = try ConnectedPair()
        defer { pair.shutdown() }
        try pair.peer.sendRaw([0, 0, 0, 1, 0x7F])  // unknown frame type
        #expect(pair.recorder.wait { events in
            events.contains { if case .connectionStateChanged(.waitingToReconnect(_, .protocolViolation)) = $0 { return true } else { return false } }
        })
        _ = try pair.peer.waitForClose()
    }
}

/// Values produced on other threads, with a bounded wait for how many arrived.
final class Collector<T>: @unchecked Sendable {
    private let condition = NSCondition()
    private var values: [T] = []

    func append(_ value: T) {
        condition.lock(); values.append(value); condition.broadcast(); condition.unlock()
    }

    var value: [T] { condition.lock(); defer { condition.unlock() }; return values }

    func wait(forCount count: Int, within timeout: TimeInterval = 5) -> Bool {
        let deadline = Date(timeIntervalSinceNow: timeout)
        condition.lock()
        defer { condition.unlock() }
        while values.count < count { if !condition.wait(until: deadline) { return values.count >= count } }
        return true
    }
}
