import SignalingProtocol
import SignalingSupport
import SignalingTLS

/// Everything the connect thread needs, captured on the client's queue when the attempt
/// is created, so the thread never touches client state.
struct HandshakePlan: Sendable {
    /// The configuration's servers, tried from `preferredServer` on (`ServerRotation`).
    var servers: [ServerEndpoint]
    /// The index of the server that last worked (sticky), or the one to try next.
    var preferredServer: Int
    var resolver: HostResolver
    /// HELLO as the client would like to send it (with the resume point if it has one).
    var hello: Hello
    /// Largest frame accepted from the server before its WELCOME says otherwise.
    var maxFrameLength: Int
    /// The app's source of fresh credentials (`ClientConfiguration.credentialsProvider`).
    var credentialsProvider: (@Sendable (Close) -> [UInt8]?)?
    /// The CLOSE that made the current credentials unusable (action `refreshCredentials`):
    /// when set, the thread asks the provider before it connects.
    var credentialsRefusal: Close?
    /// TLS to speak before HELLO; nil for plain TCP.
    var tls: TLSClientSetup?
    /// The TLS session of an earlier connection to each server (by index), offered for
    /// resumption (a ticket): the reconnect then costs the server no signature and no
    /// certificate. Kept per server because a ticket is only good where it was issued (or
    /// on the nodes that share its key), and is bound to the name checked.
    var tlsSessions: [Int: TLSSession]
    /// For the walk's failures (one line per server that failed).
    var logger: Logger
}

/// A connected socket that has completed HELLO/WELCOME and is not yet marked.
struct HandshakenSocket: Sendable {
    /// The socket, with its TLS when the plan had TLS.
    let stream: SocketStream
    let welcome: Welcome
    /// The index of the server (in `HandshakePlan.servers`) that answered.
    let server: Int
    let localAddress: SocketAddress
    let remoteAddress: SocketAddress
    /// Bytes received after the WELCOME (the first resent events): the connection's
    /// reader starts with these.
    let leftover: [UInt8]
    /// True when the server refused the resume point (CLOSE `sessionUnknown` or
    /// `invalidSequence`) and the attempt went on with a fresh session.
    let resumeRefused: Bool
    /// The credentials the server accepted (fresh ones if the provider was asked).
    let credentials: [UInt8]?
    /// The TLS session to offer next time (the server's ticket, which arrives before
    /// WELCOME); nil for plain TCP or a server that sent no ticket.
    let tlsSession: TLSSession?
}
