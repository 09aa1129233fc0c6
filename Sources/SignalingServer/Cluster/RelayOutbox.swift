/// Relay frames gathered during one loop callback, in order per destination, and sent as
/// one packet per destination when the callback ends (`EventLoop.owned`): the one
/// batching of both ends of the relay. The home's `RelayIO` gathers per front (its node
/// id); a front loop's `LoopRelay` per route epoch (`FrontRelay`: the home of that epoch,
/// resolved when it sends).
///
/// Consecutive `data` for one connection become one frame (a device's two reads, or the
/// home's several writes to one device, in one callback).
///
/// Cost: one dictionary entry and one array of frames per destination that has frames
/// this callback; `sendAll` empties it, keeping the dictionary's capacity. Joining data
/// copies the bytes gathered so far for that connection (short: one callback's worth).
struct RelayOutbox<Destination: Hashable> {
    private var frames: [Destination: [RelayPacket.Frame]] = [:]

    var isEmpty: Bool { frames.isEmpty }

    mutating func append(_ frame: RelayPacket.Frame, for destination: Destination) {
        frames[destination, default: []].append(frame)
    }

    /// `bytes` for `connection`, joined to the last frame for `destination` when that is
    /// data for the same connection.
    mutating func appendData(_ bytes: some Collection<UInt8>, connection: UInt64, for destination: Destination) {
        if case .data(connection: connection, bytes: var queued)? = frames[destination]?.last {
            frames[destination]!.removeLast()
            queued.append(contentsOf: bytes)
            frames[destination]!.append(.data(connection: connection, bytes: queued))
        } else {
            frames[destination, default: []].append(.data(connection: connection, bytes: Array(bytes)))
        }
    }

    /// Drops everything gathered (the route it was for is gone).
    mutating func removeAll() {
        frames.removeAll(keepingCapacity: true)
    }

    /// Hands each destination's frames to `send`, then empties the outbox.
    mutating func sendAll(_ send: (Destination, [RelayPacket.Frame]) -> Void) {
        for (destination, frames) in frames { send(destination, frames) }
        frames.removeAll(keepingCapacity: true)
    }
}
