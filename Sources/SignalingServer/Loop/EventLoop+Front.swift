import SignalingProtocol
import SignalingSupport

/// What a front loop keeps about the connections it relays (docs/CLUSTER.md, "Fronts").
/// Loop-thread state, touched only under the loop's `ownership`.
///
/// Cost: one dictionary entry (slot → generation, about 16 bytes with the table's
/// overhead) per relayed connection (and per held one, with the bytes it sent while
/// held); nothing in `ConnectionState`, whose flag bits are all taken.
final class LoopRelay {
    let front: FrontRelay
    /// Connections announced to the home (`.open`) under `epoch` and not ended since:
    /// slot → generation. Only these get `.closed` when they end, and only these take
    /// the home's frames.
    var opened: [UInt32: UInt32] = [:]
    /// Connections held until the home is known to listen (`FrontRelay.Admission.wait`):
    /// slot → generation. Their bytes wait in their `inbound`; announced (`.open`, then
    /// those bytes) when the route says so, closed at their handshake deadline otherwise.
    var waiting: [UInt32: UInt32] = [:]
    /// The route epoch (`FrontRelay`) the connections of `opened` were opened under.
    var epoch: UInt64 = 0
    /// Frames for the home gathered during the current callback, under `epoch` (the home
    /// of that route epoch): sent as one packet when the callback ends (`EventLoop.owned`).
    var outbox = RelayOutbox<UInt64>()

    init(front: FrontRelay) {
        self.front = front
    }
}

/// Front mode of a loop (docs/CLUSTER.md, "Fronts"): the same accept, PROXY header, TLS,
/// per-address cap, writes with back-pressure, slow-consumer and lingering close as for a
/// connection of its own, but no protocol: once a connection's PROXY header (if any) and
/// TLS handshake are done it is announced to the home (`.open`), every byte the device
/// sends goes to the home as it was read (`.data`), and what the home sends (whole frames)
/// is written to the socket.
///
/// - A relayed connection stays in `awaitingHello` until the home's first bytes (its
///   WELCOME, or a CLOSE), then is `established`: the handshake deadline, counted from
///   the accept, also bounds a home that never answers (CLOSE handshakeTimeout, as the
///   home would send). The home runs the keep-alive and idle timers: the front keeps none.
/// - The home's bytes wait in `outbound` like a pump's: past `--max-queued-bytes`, or
///   with nothing read for `--slow-consumer-timeout`, the front closes with CLOSE
///   slowConsumer (it cannot make the home wait: the relay has no flow control).
/// - Every close the front decides (slow consumer, drain, handshake deadline) and every
///   end of the socket is told to the home (`.closed`); `.finish` from the home lingers as
///   the home's own close would; `.release` closes at once unless finishing.
/// - When the route breaks (`FrontRelay`), every connection opened under the old epoch
///   gets CLOSE goingAway with the drain's reconnect advice, and nothing more is sent
///   for them; a device that arrives while there is no route gets the same CLOSE.
/// - A device that arrives while the home is not known to listen yet is held (`waiting`):
///   what it sends waits in its `inbound` (at most `--max-frame-length` bytes: a HELLO
///   and a little more) and is relayed behind its `.open` once the home listens; at its
///   handshake deadline it gets CLOSE goingAway with the drain's advice.
extension EventLoop {
    /// Bytes from the device of `slot` (the front's `consume`).
    func relayInput(_ slot: UInt32, _ bytes: UnsafeRawBufferPointer) {
        guard let relay = frontRelay else { return }
        let state = table.state(slot)
        if state.pointee.flags.contains(.awaitingProxyHeader) {
            // A plain connection behind a balancer: the header first (kept in `inbound`
            // until complete), then the device's bytes behind it.
            let generation = state.pointee.generation
            let buffered = (state.pointee.inbound ?? []) + bytes
            state.pointee.inbound = nil
            let used = buffered.withUnsafeBytes { takeProxyHeader(slot, $0) }
            guard used > 0 else {
                state.pointee.inbound = buffered
                return
            }
            guard table.isLive(slot, generation: generation), state.pointee.phase == .awaitingHello else { return }
            if used < buffered.count { state.pointee.inbound = Array(buffered[used...]) }
            openRelay(slot)
            return
        }
        guard bytes.count > 0 else { return }
        let generation = state.pointee.generation
        if relay.opened[slot] == generation {
            relay.outbox.appendData(bytes, connection: reference(slot).packed, for: relay.epoch)
        } else if relay.waiting[slot] == generation {
            hold(slot, bytes)
        }
    }

    /// Keeps what a held device sent until the home listens: at most `--max-frame-length`
    /// bytes (its HELLO fits), past which it is closed as for no route.
    private func hold(_ slot: UInt32, _ bytes: UnsafeRawBufferPointer) {
        let state = table.state(slot)
        let held = state.pointee.inbound?.count ?? 0
        guard held + bytes.count <= context.configuration.maxFrameLength else {
            closeConnection(slot, with: relayGoingAway("the routing node does not listen yet, and more than one frame waits for it"))
            return
        }
        if state.pointee.inbound == nil { state.pointee.inbound = [] }
        state.pointee.inbound!.append(contentsOf: bytes)
    }

    /// Announces the connection to the home once its PROXY header (if any) and TLS
    /// handshake are done, with the bytes it sent meanwhile (`inbound`); holds it while the
    /// home is not known to listen; without a route, refuses it (CLOSE goingAway).
    func openRelay(_ slot: UInt32) {
        guard let relay = frontRelay else { return }
        let state = table.state(slot)
        let generation = state.pointee.generation
        let epoch: UInt64
        switch relay.front.admission() {
        case .refuse:
            relay.waiting[slot] = nil
            forgetProxiedPeer(slot, generation: generation)
            closeConnection(slot, with: relayGoingAway("no routing node is reachable from this node"))
            return
        case .wait:
            relay.waiting[slot] = generation  // its PROXY-named address is kept for the `.open`
            return
        case .relay(let current):
            epoch = current
        }
        relay.waiting[slot] = nil
        if epoch != relay.epoch { abandonRelayed(movingTo: epoch) }
        relay.opened[slot] = generation
        countRelayed(slot, opened: true)
        let connection = reference(slot).packed
        relay.outbox.append(.open(
            connection: connection, peer: peerDescription(slot), tls: state.pointee.flags.contains(.tls)), for: relay.epoch)
        if let held = state.pointee.inbound {
            state.pointee.inbound = nil
            relay.outbox.appendData(held[...], connection: connection, for: relay.epoch)
        }
        forgetProxiedPeer(slot, generation: generation)
    }

    /// The route changed (`LoopTask.relayRouteChanged`): close what was relayed under an
    /// older epoch, and announce the held devices if the home is now known to listen.
    func relayRouteChanged() {
        guard let relay = frontRelay else { return }
        let epoch = relay.front.epoch
        if epoch != relay.epoch { abandonRelayed(movingTo: epoch) }
        guard !relay.waiting.isEmpty, relay.front.admission() != .wait else { return }
        refreshTime()
        for (slot, generation) in relay.waiting {
            guard table.isLive(slot, generation: generation), table.state(slot).pointee.phase == .awaitingHello else {
                relay.waiting[slot] = nil
                continue
            }
            openRelay(slot)
        }
    }

    /// Whether `slot` is a device held until the home listens (its handshake deadline
    /// closes it with CLOSE goingAway rather than handshakeTimeout).
    func isHeldForRoute(_ slot: UInt32, generation: UInt32) -> Bool {
        frontRelay?.waiting[slot] == generation
    }

    /// The CLOSE of a device held past its handshake deadline: the home never listened.
    func heldTooLong() -> Close {
        relayGoingAway("the routing node did not listen within \(context.configuration.handshakeTimeout.wholeSecondsRoundedUp) s")
    }

    /// Closes every connection opened under the loop's epoch with CLOSE goingAway (bytes
    /// may have been lost either way) and moves to `epoch`. The old home hears nothing
    /// more of them: the new one was (or will be) told `.reset`.
    private func abandonRelayed(movingTo epoch: UInt64) {
        guard let relay = frontRelay else { return }
        let abandoned = relay.opened
        relay.opened = [:]
        relay.outbox.removeAll()
        relay.epoch = epoch
        let frame = relayGoingAway("the routing node changed or cannot be reached")
        for (slot, generation) in abandoned where table.isLive(slot, generation: generation) {
            countRelayed(slot, opened: false)
            closeConnection(slot, with: frame)
        }
    }

    /// Frames from the home for this loop's connections (`LoopTask.relayed`). Frames for a
    /// connection that has ended, or was opened under an older epoch, are dropped.
    func handleRelayed(_ frames: [RelayPacket.Frame]) {
        guard let relay = frontRelay else { return }
        refreshTime()
        for frame in frames {
            guard let ref = ConnectionRef(packed: frame.connection), relay.opened[ref.slot] == ref.generation,
                  table.isLive(ref.slot, generation: ref.generation)
            else { continue }
            let slot = ref.slot
            let state = table.state(slot)
            let phase = state.pointee.phase
            switch frame {
            case .data(_, let bytes):
                guard phase == .awaitingHello || phase == .established else { continue }
                state.pointee.phase = .established
                scratch.removeAll(keepingCapacity: true)
                scratch.append(contentsOf: bytes)
                writeScratch(to: slot)
                let queued = table.isLive(slot, generation: ref.generation) ? queuedBytes(slot) : 0
                if queued > context.configuration.maxQueuedBytes {
                    closeSlowConsumer(slot, because: "more than \(context.configuration.maxQueuedBytes) bytes waited unread (\(queued))")
                }
            case .finish:
                guard phase == .awaitingHello || phase == .established else { continue }
                linger(slot)
            case .release:
                relay.opened[slot] = nil
                countRelayed(slot, opened: false)
                if phase != .closing { destroy(slot) }
            case .open, .closed, .reset:
                continue
            }
        }
    }

    /// A relayed connection ends (the front closes it, or its socket ended): the home
    /// hears it in this callback's packet.
    func relayEnded(_ slot: UInt32) {
        guard let relay = frontRelay else { return }
        let generation = table.state(slot).pointee.generation
        if relay.waiting[slot] == generation { relay.waiting[slot] = nil }
        guard relay.opened[slot] == generation else { return }
        relay.opened[slot] = nil
        countRelayed(slot, opened: false)
        relay.outbox.append(.closed(connection: reference(slot).packed), for: relay.epoch)
    }

    /// `voipserver_front_relayed_connections{transport}`: a live connection of `slot`
    /// entered or left `LoopRelay.opened` (every entry is counted once each way: an entry
    /// leaves before its slot is freed, `relayEnded`).
    private func countRelayed(_ slot: UInt32, opened: Bool) {
        let counters = context.counters
        let tls = table.state(slot).pointee.flags.contains(.tls)
        if opened {
            counters.relayedConnections.increment()
            if tls { counters.relayedTLSConnections.increment() }
        } else {
            counters.relayedConnections.decrement()
            if tls { counters.relayedTLSConnections.decrement() }
        }
    }

    /// Sends this callback's frames to the home, one packet (end of `owned`).
    func sendRelayed() {
        guard let relay = frontRelay, !relay.outbox.isEmpty else { return }
        // Dropped when the route broke meanwhile: `relayRouteChanged` closes those connections.
        relay.outbox.sendAll { epoch, frames in relay.front.send(frames, epoch: epoch) }
    }

    /// The CLOSE of a relayed device whose route is lost: reconnect as after a drain.
    private func relayGoingAway(_ reason: String) -> Close {
        var frame = drainClose
        frame.message = "\(reason); reconnect after the advised delay"
        return frame
    }
}
