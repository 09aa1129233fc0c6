import SignalingProtocol
import SignalingSupport

/// One connect attempt's walk over the servers, as a state machine: the connect thread
/// feeds it what happened (a name resolved, an address failed) and the time, it answers
/// with the next step. It does no I/O and reads no clock, so the rules are tested alone.
///
/// Rules (docs/CLIENT.md, "Several servers"):
/// - servers are tried in the configured order starting at `preferred` (the one that
///   last worked: sticky), wrapping around; each server's addresses in the resolver's
///   order;
/// - a failure that another server may not have (refused, unreachable, a timeout, a
///   broken or refused TLS handshake, a CLOSE with action `resume` or `fresh`: a node
///   shutting down, overloaded, out of connections for this address) moves on to the
///   next address, then the next server; a failure no other server can fix (a CLOSE with
///   action `stop` or `refreshCredentials`, missing credentials, a cancellation) ends the
///   walk at once;
/// - each address gets a fair share of the time left: `(deadline − now) / (addresses
///   left of this server + servers left after it)`, so one that swallows packets cannot
///   eat the whole attempt, and the last one gets everything that is left;
/// - the walk never starts a server twice; once every server failed it reports one error
///   for the whole list (`combinedError`), and the client backs off as after any failure.
///
/// Cost: O(servers + addresses of the current server) memory; each step is O(1) apart
/// from `combinedError`, O(failures).
struct ServerRotation {
    enum Step: Equatable {
        /// Resolve server `endpoint` (an index in the configuration's list).
        case resolve(endpoint: Int)
        /// Connect to `address` of server `endpoint` and handshake, giving up on it at `until`.
        case connect(endpoint: Int, address: SocketAddress, until: Instant)
        /// The walk is over without a connection.
        case failed(ConnectError)
    }

    /// Server indices in the order they are tried.
    let order: [Int]
    /// The attempt's deadline: the walk ends with the last failure once it has passed.
    let deadline: Instant
    private var serverPosition = 0
    private var addresses: [SocketAddress] = []
    private var addressPosition = 0
    /// Every failure so far, in order.
    private(set) var failures: [ConnectError] = []
    private var finished = false

    /// - Parameters:
    ///   - serverCount: the length of the configuration's list (at least 1).
    ///   - preferred: the server to try first (taken modulo `serverCount`).
    init(serverCount: Int, preferred: Int, deadline: Instant) {
        precondition(serverCount >= 1, "a rotation needs at least one server")
        let first = ((preferred % serverCount) + serverCount) % serverCount
        order = (0..<serverCount).map { (first + $0) % serverCount }
        self.deadline = deadline
    }

    /// The first step: resolve the preferred server.
    func start() -> Step { .resolve(endpoint: order[0]) }

    /// The current server's host resolved to `resolved` (in the order to try them).
    mutating func resolved(_ resolved: [SocketAddress], now: Instant) -> Step {
        addresses = resolved
        addressPosition = 0
        guard !addresses.isEmpty else {
            return failed(.resolutionFailed(host: "server \(order[serverPosition])", reason: "no address"), now: now)
        }
        return connectStep(now: now)
    }

    /// The current step failed with `error` (a resolution, or a connect and handshake).
    mutating func failed(_ error: ConnectError, now: Instant) -> Step {
        guard !finished else { return .failed(combinedError) }
        failures.append(error)
        guard Self.movesOn(after: error) else { return finish(with: error) }
        guard now < deadline else { return finish(with: combinedError) }
        if addressPosition + 1 < addresses.count {
            addressPosition += 1
            return connectStep(now: now)
        }
        guard serverPosition + 1 < order.count else { return finish(with: combinedError) }
        serverPosition += 1
        addresses = []
        addressPosition = 0
        return .resolve(endpoint: order[serverPosition])
    }

    private mutating func finish(with error: ConnectError) -> Step {
        finished = true
        return .failed(error)
    }

    private func connectStep(now: Instant) -> Step {
        let candidatesLeft = (addresses.count - addressPosition) + (order.count - serverPosition - 1)
        let share = (deadline - now) / candidatesLeft
        return .connect(endpoint: order[serverPosition], address: addresses[addressPosition], until: now + share)
    }

    /// True when another address or server may succeed where this one failed.
    static func movesOn(after error: ConnectError) -> Bool {
        switch error {
        case .timedOut, .refused, .unreachable, .resolutionFailed, .protocolViolation, .closedDuringHandshake,
             .socketError, .certificateRejected, .pinMismatch, .tlsHandshakeFailed:
            return true
        case .rejected(let close):
            // resume: this node cannot take the device now (shutting down, overloaded, too
            // many connections from this address); fresh: it does not know the session (the
            // handshake already retried it once without the resume point).
            return close.action == .resume || close.action == .fresh
        case .cancelled, .clientShutDown, .invalidTimeout, .credentialsUnavailable:
            return false
        }
    }

    /// The one error reported for a walk in which every server failed: the last CLOSE if
    /// a server sent one (its advised delay is honoured), else the last failure that is
    /// not about a certificate (the ordinary back-off: a node with a bad certificate must
    /// not make the client wait minutes for the others), else the last certificate
    /// failure (every server presented one: the long wait of a captive portal).
    var combinedError: ConnectError {
        if let close = failures.last(where: { if case .rejected = $0 { return true } else { return false } }) { return close }
        if let other = failures.last(where: { !$0.isCertificateFailure }) { return other }
        return failures.last ?? .timedOut
    }

    /// The server to prefer after the connection to `connected` ended with `close`: the
    /// next one when the CLOSE says this node cannot keep the device now (it is shutting
    /// down, overloaded, over its per-address limit, or broken), the same one otherwise
    /// (sticky: a lost connection is usually the device's network, not the server).
    static func preferred(after close: Close?, connected: Int, serverCount: Int) -> Int {
        guard let close, serverCount > 1 else { return connected }
        switch close.code {
        case .goingAway, .overloaded, .tooManyConnections, .internalError: return (connected + 1) % serverCount
        default: return connected
        }
    }
}
