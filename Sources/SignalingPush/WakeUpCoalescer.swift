import SignalingStore

/// Folds a batch of wake-ups taken from the gateway's inbox per device, on the gateway's
/// thread, before the scheduler sees them: a burst of events for one device costs the
/// scheduler one wake-up. The submitters no longer coalesce (they share no lock, see
/// `GatewayInbox`), so this is where a burst becomes one entry.
///
/// Confined to the gateway's thread. Cost: nothing for a batch of one (the common case
/// of a quiet gateway); otherwise one dictionary lookup and insert per wake-up, with the
/// dictionary's storage kept from batch to batch.
struct WakeUpCoalescer {
    private var indexByDevice: [DeviceKey: Int] = [:]

    /// Folds every later wake-up of a device in `batch` into its first one (the
    /// higher-ranked kind, the latest counter: `WakeUp.absorb`), keeping the devices in
    /// the order of their first wake-up. Returns how many wake-ups were folded away.
    mutating func coalesce(_ batch: inout [WakeUp]) -> Int {
        guard batch.count > 1 else { return 0 }
        defer { indexByDevice.removeAll(keepingCapacity: true) }
        var kept = 0
        for index in batch.indices {
            let wakeUp = batch[index]
            if let first = indexByDevice[wakeUp.device] {
                batch[first].absorb(wakeUp)
            } else {
                indexByDevice[wakeUp.device] = kept
                // What `kept` held was folded already; `index` is never read again.
                if kept != index { batch.swapAt(kept, index) }
                kept += 1
            }
        }
        let folded = batch.count - kept
        batch.removeLast(folded)
        return folded
    }
}
