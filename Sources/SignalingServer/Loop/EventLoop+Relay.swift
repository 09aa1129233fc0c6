import SignalingProtocol

// Relayed connections on the routing node (docs/ARCHITECTURE.md, "Relayed connections"):
// a front node holds the device's socket and relays its bytes over the node link; here the
// connection is a slot like any other, flagged `relayed`, with fd -1, whose transport is
// the loop's `RelayIO`. Above the seam (ConnectionIO.swift) nothing differs: handshake,
// keep-alive, idle timeout, takeover, routing and the move to the user's home loop run as
// for a socket. The front's inputs wait in the connection's mailbox (`RelayDirectory`)
// and are handled here in order by the loop that has the connection.

extension EventLoop {
    /// The transport of `slot` when it is not a socket of this loop's own: the embedded
    /// loop's (tests), or the relay's for a relayed connection. One branch on a flag for a
    /// socket.
    @inline(__always)
    func transport(of slot: UInt32) -> (any ConnectionIO)? {
        if let embeddedIO { return embeddedIO }
        return table.state(slot).pointee.flags.contains(.relayed) ? relayIO : nil
    }

    /// Handles what the front sent for `key`, in order, if this loop has the connection
    /// (`LoopTask.relay`). Stops when the connection begins to move to its user's home
    /// loop: the rest waits in the mailbox for that loop.
    func runRelayInputs(_ key: RelayKey) {
        guard let relayIO, let (place, inputs) = relayIO.home.directory.take(key, loop: index) else { return }
        var slot: UInt32?
        if case .open(let opened) = place { slot = opened }
        for (position, input) in inputs.enumerated() {
            if case .open(let peer, let tls) = input {
                guard slot == nil else { continue }  // the directory refuses a second open
                slot = openRelayed(key, peer: peer, tls: tls)
                if slot == nil { return }
                continue
            }
            // The slot still holds this connection (a close ended it, or never began it).
            guard let current = slot, relayIO.connection(in: current)?.key == key else { return }
            let state = table.state(current)
            if state.pointee.phase == .handingOver {
                relayIO.home.directory.putBack(inputs[position...], for: key)
                return
            }
            switch input {
            case .open: break
            case .data(let bytes):
                guard state.pointee.phase == .awaitingHello || state.pointee.phase == .established else { continue }
                bytes.withUnsafeBytes { received(current, $0) }
            case .closed:
                peerClosed(current)
                return
            }
        }
    }

    /// A front's new connection: a slot, then the accepting rule of a socket (`open`: the
    /// per-address cap on the device's address, the handshake deadline). Nil when no slot
    /// is free: the front is told to close it, with CLOSE overloaded.
    private func openRelayed(_ key: RelayKey, peer: String, tls: Bool) -> UInt32? {
        guard let relayIO else { return nil }
        guard let slot = table.allocate() else {
            relayIO.refuse(key, with: Self.serverFull)
            return nil
        }
        table.state(slot).pointee.flags.insert(.relayed)
        relayIO.attach(RelayIO.Connection(key: key, peer: peer, tls: tls), in: slot)
        relayIO.home.connectionOpened(tls: tls)
        open(slot, fd: -1, addressHash: RelayHome.addressHash(ofPeer: peer), proxied: false)
        return slot
    }
}
