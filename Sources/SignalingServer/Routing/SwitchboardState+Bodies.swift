import SignalingProtocol

/// Bodies in memory only while they may be written soon (docs/STORAGE.md, "Bodies in
/// memory"). With a store that hands bodies back (`EventBodySource`), a committed message
/// that no connected device is about to receive keeps only its metadata (number, type,
/// receipt, flags) in memory: a device offline for a week, or a user nobody has used yet,
/// costs its events' bookkeeping, not their bodies. When a device connects, its pump stops
/// at the first evicted body and asks the store writer for the bodies (`StoreWriter
/// .requestBodies`), which reads them once everything queued before is committed and puts
/// them back with `restoreBodies`.
extension SwitchboardState {
    /// Drops a committed message's body from memory unless a device that may receive it
    /// is connected. Shared events (a fan-out) go when every recipient device is offline.
    mutating func evictIfUnwanted(_ event: QueuedEvent) {
        guard evictsBodies, event.isDurable, event.isResident, !event.isCancelled, let receipt = event.receipt else { return }
        // A connected device that holds it will be written to soon. (Any other holder that
        // connects reads it back.)
        guard !devices(of: receipt.recipient).contains(where: \.isOnline) else { return }
        event.evictBody()
        counters.bodiesEvicted += 1
    }

    /// Bodies read back from the store for `device`'s events from `first` on. An event
    /// whose body the store does not have (it is not stored: a bug, or a damaged store) is
    /// cancelled rather than asked for again and again; returns those, to be reported.
    mutating func restoreBodies(_ bodies: [(seq: UInt64, body: [UInt8])], of device: DeviceRecord, from first: UInt64) -> [UInt64] {
        var found = Set<UInt64>()
        for (seq, body) in bodies {
            found.insert(seq)
            guard let event = device.queue.event(seq), !event.isResident else { continue }
            event.restoreBody(body)
            counters.bodiesRestored += 1
        }
        var lost: [UInt64] = []
        let last = bodies.last?.seq ?? first
        device.queue.forEach(after: first &- 1) { seq, event in
            guard seq <= last else { return false }
            if !event.isResident && !event.isCancelled && !found.contains(seq) {
                event.isCancelled = true
                lost.append(seq)
            }
            return true
        }
        return lost
    }
}
