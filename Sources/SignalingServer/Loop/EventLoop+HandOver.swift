import CLibeventShims
import SignalingProtocol
import SignalingSupport
import SignalingTLS
#if canImport(Glibc)
import Glibc
#endif

// Where a connection lives (docs/ARCHITECTURE.md, "Where a connection lives").
//
// The kernel spreads new connections over the loops at random (SO_REUSEPORT), but every
// request of a device takes its user's shard, and shard i is owned by loop i
// (`Switchboard.ownerLoop(ofShard:shardCount:loopCount:)`). So once its HELLO is verified a
// connection moves to its user's home loop and lives there: the loop that handles a
// device's requests, ACKs and pumps is the owner of the shard they touch, and a takeover
// (the same device connecting again) finds the old connection on the same loop.
//
// The move happens in the handshake after everything that needs no shard (admission,
// keep-alive, the token's HMAC: the CPU-heavy part stays where the connection was
// accepted) and before the hold that registers the device. Until that hold no
// `DeviceRecord` refers to the connection: nothing in the routing state can wake it,
// write to it or close it while it moves, which is what keeps the move simple (no
// forwarding, no second owner for a moment).
//
// What moves, in one `MovingConnection` that crosses threads once and is owned by one
// loop at a time: the socket (not closed, not accepted again) or the embedded transport's
// connection, the TLS state (the SSL object and its buffers: the old loop has stopped
// touching it), the PROXY header's device address, the bytes read after the HELLO
// (pipelined requests, handled on the new loop in order after the WELCOME), the per-address
// accounting (`countsTowardAddress` and the address hash), the verified HELLO.
// The old loop stops reading at once (`ConnectionPhase.handingOver`), removes the socket's
// event from its event base and frees the slot (its handshake deadline and wheel entries
// are keyed by slot and generation, so they go stale with it). The home loop takes a slot
// of its own (a new `ConnectionRef`), watches the socket, and finishes the handshake.

/// A HELLO that passed everything but the routing shard: what the second half of the
/// handshake (`EventLoop.register`) needs.
struct VerifiedHello: Sendable {
    let hello: Hello
    /// The keep-alive interval granted and the idle timeout that goes with it.
    let keepAliveSeconds: UInt32
    let idleTimeoutSeconds: UInt32
}

/// A connection on its way from the loop that verified its HELLO to its user's home loop
/// (`LoopTask.adopt`). Built by the old loop once it no longer touches the connection,
/// handed over through the home loop's inbox, used by the home loop only from then on:
/// one owner at a time, so `@unchecked Sendable` (the TLS state is a pointer, and the
/// embedded transport's connection an object of the test's thread).
final class MovingConnection: @unchecked Sendable {
    /// The loop it goes to.
    let home: UInt16
    let fd: Int32
    let tls: TLSConnection?
    /// An embedded loop's connection, or a relayed connection's (`ConnectionIO.handOver`);
    /// nil for a socket.
    let transport: AnyObject?
    /// `tls`, `relayed`, `countsTowardAddress`, `wantsWrite`: what the connection's state
    /// says about its transport and its accounting, not about the old loop.
    let flags: ConnectionFlags
    let addressHash: UInt32
    let lastActivity: UInt32
    /// Bytes read after the HELLO, not handled yet.
    let inbound: [UInt8]?
    /// Bytes the socket has not taken yet (none, unless OpenSSL wanted to write).
    let outbound: [UInt8]?
    let outboundOffset: UInt32
    let writeProgressSecond: UInt32
    /// The device's address from a PROXY header, for the handshake's log lines.
    let proxiedPeer: PeerAddress?
    let hello: VerifiedHello

    init(home: UInt16, state: ConnectionState, tls: TLSConnection?, transport: AnyObject?, proxiedPeer: PeerAddress?, hello: VerifiedHello) {
        self.home = home
        fd = state.fd
        self.tls = tls
        self.transport = transport
        flags = state.flags.intersection([.tls, .relayed, .countsTowardAddress, .wantsWrite])
        addressHash = state.addressHash
        lastActivity = state.lastActivity
        inbound = state.inbound
        outbound = state.outbound
        outboundOffset = state.outboundOffset
        writeProgressSecond = state.writeProgressSecond
        self.proxiedPeer = proxiedPeer
        self.hello = hello
    }
}

/// A connection that leaves its loop when the current callback ends.
struct Departure {
    let slot: UInt32
    let generation: UInt32
    let home: UInt16
    let hello: VerifiedHello
    /// Taken at once: the HELLO's handling forgets it before the callback ends.
    let proxiedPeer: PeerAddress?
}

extension EventLoop {
    /// The HELLO of `slot` is verified and its user lives on loop `home`: nothing more is
    /// read or handled here, and the connection leaves when the callback ends (the rest of
    /// the read it came in is still going on: a plain socket's peeked bytes are taken
    /// first, the frames after the HELLO are kept in `inbound`).
    func beginHandOver(_ slot: UInt32, _ hello: VerifiedHello, to home: UInt16) {
        let state = table.state(slot)
        let generation = state.pointee.generation
        state.pointee.phase = .handingOver
        let peer = proxiedPeers[slot].flatMap { $0.generation == generation ? $0.address : nil }
        departing.append(Departure(slot: slot, generation: generation, home: home, hello: hello, proxiedPeer: peer))
    }

    /// Hands the connections of `departing` to their home loops (end of a callback).
    func handOverDeparting() {
        let leaving = departing
        departing.removeAll(keepingCapacity: true)
        for departure in leaving {
            // A connection destroyed since (its read failed) has nothing left to move.
            guard table.isLive(departure.slot, generation: departure.generation),
                  table.state(departure.slot).pointee.phase == .handingOver
            else { continue }
            let moving = leave(departure)
            metrics.connectionsMoved.add(1)
            if !peers[Int(departure.home)].post(adopting: moving) {
                // The home loop has stopped, so the server is shutting down: the device
                // gets its CLOSE from here, and the lingering close that lets it read it.
                adopt(moving, closingWith: drainClose)
            }
        }
    }

    /// Removes a departing connection from this loop without closing anything: its event
    /// leaves the event base, its slot is freed. Returns what the home loop takes over.
    private func leave(_ departure: Departure) -> MovingConnection {
        let slot = departure.slot
        let state = table.state(slot)
        let event = table.event(slot)
        if vs_event_initialized(event) != 0 { vs_event_del(event) }
        let moving = MovingConnection(
            home: departure.home, state: state.pointee,
            tls: state.pointee.flags.contains(.tls) ? table.takeTLS(slot) : nil,
            transport: transport(of: slot)?.handOver(slot), proxiedPeer: departure.proxiedPeer, hello: departure.hello)
        openConnections.decrement()
        table.release(slot)
        return moving
    }

    /// A connection handed over by another loop comes to live here: a slot of this loop's,
    /// its socket watched by this loop's event base, then the rest of its handshake and the
    /// frames it sent after the HELLO. With `closingWith`, or while this loop drains, it is
    /// closed with that CLOSE (lingering) instead: a device in flight is never left silent.
    func adopt(_ moving: MovingConnection, closingWith close: Close? = nil) {
        guard let slot = table.allocate() else {
            dropAdoption(moving)
            return
        }
        let state = table.state(slot)
        let generation = state.pointee.generation
        state.pointee.fd = moving.fd
        state.pointee.phase = .awaitingHello
        state.pointee.flags = moving.flags.subtracting(.wantsWrite)
        state.pointee.addressHash = moving.addressHash
        state.pointee.lastActivity = moving.lastActivity
        state.pointee.inbound = moving.inbound
        state.pointee.outbound = moving.outbound
        state.pointee.outboundOffset = moving.outboundOffset
        state.pointee.writeProgressSecond = moving.writeProgressSecond
        if let tls = moving.tls { table.setTLS(tls, for: slot) }
        if let moved = moving.transport { transport(of: slot)?.takeOver(moved, in: slot) }
        openConnections.increment()
        if let peer = moving.proxiedPeer { proxiedPeers[slot] = (generation, peer) }
        defer { forgetProxiedPeer(slot, generation: generation) }
        assignEvent(slot, writable: moving.flags.contains(.wantsWrite))
        if state.pointee.outbound != nil { watchWritable(slot) }
        if let close = close ?? (drainDeadline == nil ? nil : drainClose) {
            closeConnection(slot, with: close)
            return
        }
        // The WELCOME and the replies to the frames that followed the HELLO go out in one
        // write once all are handled, as on the accepting loop (`consume`).
        beginReplies(to: slot)
        register(slot, moving.hello)
        // The frames that came after the HELLO, in order, after the WELCOME.
        if table.isLive(slot, generation: generation), state.pointee.phase == .established, state.pointee.inbound != nil {
            consume(slot, UnsafeRawBufferPointer(start: nil, count: 0))
        }
        endReplies()
        guard table.isLive(slot, generation: generation), state.pointee.phase == .established else { return }
        // What OpenSSL decrypted already is announced by no readiness event.
        if state.pointee.flags.contains(.tls), !state.pointee.flags.contains(.readPaused) {
            readAgainSoon(slot)
        }
    }

    /// No slot for a connection handed over (the table holds 2^24 slots per loop: beyond
    /// any descriptor limit for sockets, and beyond the home's memory for relayed
    /// connections, which hold no descriptor here; reached only in tests, with a smaller
    /// table, `SignalingServer.connectionSlotsPerLoop`): it ends here as `destroy` would
    /// end it, after CLOSE overloaded, as when no slot is free at accept. Its HELLO was
    /// verified but not registered: no device to detach. A relayed one gets its CLOSE
    /// through its front (then `.finish`); a plain socket as at accept (best effort, it
    /// has nothing unsent before it); a TLS socket just closes, as at accept.
    private func dropAdoption(_ moving: MovingConnection) {
        context.logger.error("handover_failed", ["error": "no free connection slot", "open": table.liveCount])
        if let tls = moving.tls {
            tls.free()
            context.counters.openTLSConnections.decrement()
        }
        if moving.flags.contains(.relayed), let transport = moving.transport {
            relayIO?.abandon(transport, with: Self.serverFull)
        } else if moving.transport == nil {
            if moving.tls == nil, moving.outbound == nil {
                refuseImmediately(moving.fd, Self.serverFull)
            } else {
                Glibc.close(moving.fd)
            }
        }
        if moving.flags.contains(.countsTowardAddress) { context.admission.releaseConnection(from: moving.addressHash) }
        context.counters.openConnections.decrement()
    }
}
