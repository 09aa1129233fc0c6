import SignalingProtocol
import SignalingSupport

/// What a server test does with one client connection, whatever carries its bytes: a real
/// socket (`TestClient`) or a connection of an embedded loop (`EmbeddedClient`). The
/// transport sends frames, reads them and reports the end of the stream; the protocol's
/// steps built on that (HELLO, requests and replies, events, CLOSE) exist once, here, so a
/// test reads the same over either.
protocol ProtocolClient: AnyObject {
    func send(_ frame: Frame) throws
    /// The next frame from the transport, or nil if the server ended the stream first.
    /// Throws when none comes (over a socket: within `timeout`; embedded: none is there
    /// once the loops have run until quiet, since nothing more can come without a step of
    /// the test).
    func read(timeout: Duration) throws -> Frame?
    /// Frames read while waiting for something else; `next` returns them first.
    var skipped: [Frame] { get set }
}

extension ProtocolClient {
    /// The next frame, or nil if the connection ended cleanly first.
    func next(timeout: Duration = .seconds(5)) throws -> Frame? {
        if !skipped.isEmpty { return skipped.removeFirst() }
        return try read(timeout: timeout)
    }

    /// Returns the first frame that matches, earlier skipped ones included; frames that do
    /// not match are kept for later `next` calls. Throws if the connection ends or time
    /// runs out.
    @discardableResult
    func expect<T>(timeout: Duration = .seconds(5), _ what: String = "frame", _ match: (Frame) -> T?) throws -> T {
        for (index, frame) in skipped.enumerated() {
            if let value = match(frame) {
                skipped.remove(at: index)
                return value
            }
        }
        let deadline = SystemClock().now() + timeout
        while true {
            let remaining = deadline - SystemClock().now()
            guard remaining > .zero else { throw TestClient.Failure("timed out waiting for \(what)") }
            guard let frame = try read(timeout: remaining) else { throw TestClient.Failure("connection closed waiting for \(what)") }
            if let value = match(frame) { return value }
            skipped.append(frame)
        }
    }

    /// Sends HELLO and returns WELCOME (throws on CLOSE).
    @discardableResult
    func hello(
        user: String, device: String = "d1", resume: ResumePoint? = nil, keepAlive: UInt32 = 0,
        credentials: [UInt8]? = nil
    ) throws -> Welcome {
        try send(.hello(Hello(
            userID: user, deviceID: device, credentials: credentials, resume: resume,
            requestedKeepAliveSeconds: keepAlive)))
        switch try next(timeout: .seconds(5)) {
        case .welcome(let welcome)?: return welcome
        case .close(let close)?: throw TestClient.Failure("refused: \(close.code) \(close.message)")
        case let other: throw TestClient.Failure("expected WELCOME, got \(String(describing: other))")
        }
    }

    /// Waits for CLOSE and then for the server to end the stream.
    func expectClose(timeout: Duration = .seconds(5)) throws -> Close {
        let close = try expect(timeout: timeout, "CLOSE") { frame -> Close? in
            if case .close(let close) = frame { return close }
            return nil
        }
        guard try read(timeout: timeout) == nil else { throw TestClient.Failure("data after CLOSE") }
        return close
    }

    /// The next event (skipping replies and pongs); returns its seq and body.
    func nextEvent(timeout: Duration = .seconds(5)) throws -> (seq: UInt64, event: Event) {
        try expect(timeout: timeout, "an event") { frame in
            if case .event(let seq, let event) = frame { return (seq, event) }
            return nil
        }
    }

    /// Waits for the reply to request `id`.
    func reply(to id: UInt32, timeout: Duration = .seconds(5)) throws -> Frame {
        try expect(timeout: timeout, "reply to \(id)") { frame in
            switch frame {
            case .ok(let requestID, _) where requestID == id: return frame
            case .error(let requestID, _, _) where requestID == id: return frame
            default: return nil
            }
        }
    }

    /// Sends a request and returns its reply.
    @discardableResult
    func request(_ id: UInt32, _ request: Request) throws -> Frame {
        try send(.request(id: id, request))
        return try reply(to: id)
    }

    func ack(_ seq: UInt64) throws { try send(.ack(seq: seq)) }

    /// The message ids of the next `count` events (an event that is not a message counts,
    /// and gives no id), each acknowledged as it is read when `acknowledging`.
    func nextMessageIDs(_ count: Int, acknowledging: Bool = true) throws -> [String] {
        var ids: [String] = []
        for _ in 0..<count {
            let (seq, event) = try nextEvent()
            if case .message(let message) = event { ids.append(message.messageID) }
            if acknowledging { try ack(seq) }
        }
        return ids
    }
}

extension Frame {
    var isOK: Bool { if case .ok = self { return true } else { return false } }

    var errorCode: ErrorCode? {
        if case .error(_, let code, _) = self { return code }
        return nil
    }
}
