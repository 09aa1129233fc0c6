import SignalingSupport

// The seam between a loop's protocol logic and its sockets (docs/ARCHITECTURE.md, "The
// seam: a loop without sockets").
//
// Above it, one copy of the logic: the `EventLoop` extensions that decode frames, run the
// handshake, call the switchboard, pump events, and keep the handshake, idle, linger and
// slow-consumer deadlines. Its inputs are plain calls made in a callback (`owned`):
// `received(_:_:)` (bytes that arrived), `peerClosed(_:)`, `flushOutbound(_:)` (the socket
// became writable), `tick()` (the clock moved), `runInbox()` (work handed over by other
// loops, the store writer, the admin API). Below it, the socket layer: libevent, recv and
// send, TLS, PROXY headers, accept. What the logic asks of a connection's socket goes
// through the operations of `ConnectionIO`; everything else it does (wake another
// connection, close a connection, queue store work) stays in loop state or in the
// switchboard and reaches the socket layer only through those. A connection that moves to
// its user's home loop (EventLoop+HandOver.swift) leaves one loop's transport
// (`handOver`) and joins the other's (`takeOver`), as a socket leaves one event base for
// another.
//
// A real loop has no `ConnectionIO` (`EventLoop.embeddedIO` is nil) and calls the socket
// code directly: the branch costs one predictable test per write, no indirect call. The
// one exception is a relayed connection on a cluster's routing node (flag `relayed`,
// EventLoop+Relay.swift): its transport is the loop's `RelayIO`, which a front's node link
// carries to the device's socket (`EventLoop.transport(of:)` picks per connection). The
// tests' embedded loops (Tests/SignalingServerTests/Support/EmbeddedServer.swift) put one
// in: their connections are byte buffers, their time a `ManualClock`, their inboxes run
// when the test says, on the test's thread, with no socket, no epoll wait and no thread.

/// What the loop's protocol logic asks of a connection's transport (see above). Called on
/// the loop's thread in a callback (`EventLoop.owned`).
///
/// Writes answer at once how much the transport took, because what a connection keeps in
/// `outbound` (and so back-pressure, slow-consumer checks and where a CLOSE goes) depends
/// on it; the other operations have no answer.
protocol ConnectionIO: AnyObject {
    /// Writes some of `bytes` (whole frames) to the connection; `.wouldBlock` when it takes
    /// nothing now. The loop keeps the rest and retries once `writable`.
    func transmit(_ bytes: UnsafeRawBufferPointer, to slot: UInt32) -> IOResult
    /// The connection's input is wanted (unless reading is paused) and, with `writable`,
    /// its writability: the transport calls `received` / `flushOutbound` accordingly.
    func watch(_ slot: UInt32, readable: Bool, writable: Bool)
    /// Everything to send has been sent (the CLOSE last): the peer sees end of stream.
    func finishWriting(_ slot: UInt32)
    /// The slot is released; the transport forgets the connection (a real socket closes).
    func release(_ slot: UInt32)
    /// The connection of `slot` moves to another loop: the transport forgets it without
    /// ending it, and returns it for the other loop's transport (`takeOver`).
    func handOver(_ slot: UInt32) -> AnyObject
    /// A connection another loop's transport handed over now lives in `slot` of this one.
    func takeOver(_ connection: AnyObject, in slot: UInt32)
}
