import SignalingProtocol
import SignalingSupport

/// PROXY protocol version 2 on the device listener (`--proxy-protocol`): behind a load
/// balancer every connection's socket address is the balancer's, so each connection
/// first carries a header naming the device's address (`ProxyHeader`). That address is
/// what the per-address cap counts and what the logs show.
///
/// Cost: nothing per idle connection. Until the header is complete its bytes wait in the
/// connection's `inbound`, like a partial frame, and the connection is in `awaitingHello`
/// with the `awaitingProxyHeader` flag, under the handshake deadline. The address itself
/// is kept in `proxiedPeers` only from the header to the HELLO, for the handshake's log
/// lines: removed when the HELLO is handled, or when the handshake deadline passes.
extension EventLoop {
    /// Handles the PROXY header at the start of a connection's input. Returns the bytes
    /// it used: 0 while the header is incomplete (the caller keeps them in `inbound`),
    /// the header's length once it is complete and the device's address admitted, and
    /// all of them when the connection was refused (a bad header, or over the cap).
    func takeProxyHeader(_ slot: UInt32, _ bytes: UnsafeRawBufferPointer) -> Int {
        switch ProxyHeader.parse(bytes) {
        case .incomplete:
            return 0
        case .invalid(let reason):
            // Worth a warn line: a balancer not configured for version 2, or a client that
            // reached the port around the balancer. A flood costs one line a second.
            if let suppressed = context.proxyHeaderLog.admit(now: nowInstant) {
                context.logger.warning("proxy_header_invalid", [
                    "conn": reference(slot), "peer": PeerAddress.ofPeer(socket: table.state(slot).pointee.fd),
                    "reason": reason, "suppressed": suppressed,
                ])
            }
            // The balancer relays the CLOSE to the device, whose bytes were not at fault: a
            // balancer set up without send-proxy-v2 must not make every phone stop for
            // good, so they are told to come back, slowly, as for a full address.
            protocolViolation(
                slot, ProtocolViolation(.malformedFrame, reason), action: .resume, retryAfterMs: 30_000, retryJitterMs: 30_000)
            return bytes.count
        case .complete(let header):
            let state = table.state(slot)
            state.pointee.flags.remove(.awaitingProxyHeader)
            // LOCAL and UNSPEC keep the socket's own address (set at accept).
            if let source = header.source {
                state.pointee.addressHash = source.hash
                proxiedPeers[slot] = (state.pointee.generation, source)
            }
            guard admitAddress(slot) else { return bytes.count }
            return header.length
        }
    }

    /// The connection's peer for log lines: the device's address from its PROXY header,
    /// else the socket's (one `getpeername`, so only call it for a line that is logged).
    func peerDescription(_ slot: UInt32) -> String {
        let state = table.state(slot)
        if let proxied = proxiedPeers[slot], proxied.generation == state.pointee.generation {
            return proxied.address.description
        }
        if state.pointee.flags.contains(.relayed), let relayed = relayIO?.connection(in: slot) {
            return "\(relayed.peer) via \(relayed.key.front)"
        }
        return PeerAddress.ofPeer(socket: state.pointee.fd)
    }

    /// Drops the PROXY address kept for a connection's handshake, once the handshake is
    /// over or its deadline passed (a newer connection in the slot keeps its own).
    func forgetProxiedPeer(_ slot: UInt32, generation: UInt32) {
        guard !proxiedPeers.isEmpty, proxiedPeers[slot]?.generation == generation else { return }
        proxiedPeers[slot] = nil
    }
}
