import SignalingProtocol
import SignalingSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// A device that keeps its session across connections and nodes, as the client library
/// does, for the multi-node tests: when its connection ends (a CLOSE, a killed node, a
/// refused connect) it walks its list of node ports from the first and resumes from the
/// last event it read. It acknowledges every event as it reads it, so over all its
/// connections every event must arrive exactly once (a resume point covers what was read).
///
/// Sending: a message is sent until it is accepted (OK), under the same message id each
/// time, so that a send whose reply was lost in a failure is de-duplicated by the server
/// and still delivered once. Refusals with `storeUnavailable` are counted and retried.
final class ResumingDevice {
    let user: String
    let device: String
    /// Node device ports in order of preference (the first is where it connects first).
    var ports: [UInt16]
    private(set) var client: TestClient?
    /// The port of the current connection.
    private(set) var connectedPort: UInt16?
    private(set) var session: SessionID?
    /// Every event read, over every connection, in order.
    private(set) var events: [(seq: UInt64, event: Event)] = []
    /// Connections made (the first HELLO included) and how each ended before the next.
    private(set) var connections = 0
    private(set) var closes: [CloseCode] = []
    /// Sends refused with `storeUnavailable` (the store away), retried.
    private(set) var storeUnavailableRefusals = 0
    private var nextRequestID: UInt32 = 1

    init(user: String, device: String = "d1", ports: [UInt16]) {
        self.user = user
        self.device = device
        self.ports = ports
    }

    var lastSeq: UInt64 { events.last?.seq ?? 0 }

    /// (seq, message id) of every MESSAGE read.
    var messages: [(seq: UInt64, id: String)] {
        events.compactMap { entry in
            if case .message(let message) = entry.event { return (entry.seq, message.messageID) }
            return nil
        }
    }

    /// Connects to the first port that welcomes it, resuming its session if it has one;
    /// walks the list again until `timeout`. Returns the WELCOME.
    @discardableResult
    func connect(timeout: Duration = .seconds(20)) throws -> Welcome {
        dropConnection()
        let clock = SystemClock()
        let deadline = clock.now() + timeout
        var lastFailure = "no attempt"
        while clock.now() < deadline {
            for port in ports {
                let candidate: TestClient
                let welcome: Welcome
                do {
                    candidate = try TestClient(port: port)
                    welcome = try candidate.hello(
                        user: user, device: device, resume: session.map { ResumePoint(sessionID: $0, lastReceivedSeq: lastSeq) })
                } catch {
                    lastFailure = "port \(port): \(error)"
                    continue
                }
                guard session == nil || welcome.resumed else {
                    throw TestClient.Failure("\(user)/\(device): the session was not resumed on port \(port) (Redis holds it)")
                }
                client = candidate
                connectedPort = port
                session = welcome.sessionID
                connections += 1
                return welcome
            }
            clock.sleep(until: clock.now() + .milliseconds(20))
        }
        throw TestClient.Failure("\(user)/\(device) could not connect within \(timeout): \(lastFailure)")
    }

    /// Closes the current connection from this side.
    func dropConnection() {
        client = nil
        connectedPort = nil
    }

    /// Sends MESSAGE_SEND `id` to `recipient` until it is accepted (see the type's comment).
    func send(_ id: String, to recipient: String, timeout: Duration = .seconds(20)) throws {
        let clock = SystemClock()
        let deadline = clock.now() + timeout
        while clock.now() < deadline {
            if client == nil { try connect(timeout: deadline - clock.now()) }
            guard let client else { continue }
            let requestID = nextRequestID
            nextRequestID += 1
            let reply: Frame
            do {
                reply = try client.request(requestID, .identifiedMessage(id, to: recipient))
            } catch {
                noteLoss(of: client)
                continue
            }
            switch reply.errorCode {
            case nil: return
            case .storeUnavailable?:
                storeUnavailableRefusals += 1
                clock.sleep(until: clock.now() + .milliseconds(20))
            case let code?:
                throw TestClient.Failure("\(user): \(id) refused with \(code)")
            }
        }
        throw TestClient.Failure("\(user): \(id) was not accepted within \(timeout)")
    }

    /// Reads and acknowledges events until `done` holds for what was read so far,
    /// reconnecting whenever the connection ends. Throws at `timeout`.
    func receive(timeout: Duration = .seconds(20), until done: (ResumingDevice) -> Bool) throws {
        let clock = SystemClock()
        let deadline = clock.now() + timeout
        while !done(self) {
            guard clock.now() < deadline else {
                throw TestClient.Failure("\(user)/\(device): still waiting after \(timeout); read \(messages.map(\.id))")
            }
            if client == nil { try connect(timeout: deadline - clock.now()) }
            guard let client else { continue }
            if (try? client.staysSilent(for: .milliseconds(50))) == true { continue }
            guard let frame = try? client.next(timeout: .seconds(5)) else {
                noteLoss(of: client)
                continue
            }
            switch frame {
            case .event(let seq, let event):
                events.append((seq, event))
                try? client.ack(seq)
            case .close(let close):
                closes.append(close.code)
                dropConnection()
            default:
                break
            }
        }
    }

    /// Reads until every one of `ids` has arrived.
    func receiveMessages(_ ids: [String], timeout: Duration = .seconds(20)) throws {
        try receive(timeout: timeout) { device in Set(ids).isSubset(of: Set(device.messages.map(\.id))) }
    }

    /// The next event read (acknowledged), reconnecting as needed.
    func nextEvent(timeout: Duration = .seconds(10)) throws -> Event {
        let count = events.count
        try receive(timeout: timeout) { $0.events.count > count }
        return events[count].event
    }

    /// What was wrong with the messages read against `expected` (in sending order): each
    /// exactly once, in order, under increasing sequence numbers (PROTOCOL.md: numbers
    /// may be skipped, never reused or reordered). Empty when all is well.
    func deliveryProblems(expected: [String]) -> [String] {
        var problems: [String] = []
        let read = messages
        let ids = read.map(\.id)
        if ids != expected { problems.append("\(user)/\(device) read \(ids), expected \(expected) (each once, in order)") }
        let seqs = read.map(\.seq)
        if zip(seqs, seqs.dropFirst()).contains(where: { $0 >= $1 }) {
            problems.append("\(user)/\(device): sequence numbers \(seqs) do not increase")
        }
        return problems
    }

    /// The sequence numbers `ids` arrived under, in reading order.
    func seqs(of ids: [String]) -> [UInt64] {
        messages.filter { ids.contains($0.id) }.map(\.seq)
    }

    /// Whether `ids` arrived under consecutive numbers: what one home hands out to a
    /// device's messages when nothing in between was refused, so a message assigned its
    /// number before a failure and read after it kept that number.
    func consecutive(_ ids: [String]) -> Bool {
        let numbers = seqs(of: ids)
        guard let first = numbers.first, numbers.count == ids.count else { return false }
        return numbers == Array(first..<(first + UInt64(numbers.count)))
    }

    private func noteLoss(of lost: TestClient) {
        if case .close(let close)? = lost.skipped.first(where: { if case .close = $0 { return true } else { return false } }) {
            closes.append(close.code)
        }
        dropConnection()
    }
}
