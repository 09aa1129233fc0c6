/// Shrinks a batch of changes before it is written, without changing what the store holds
/// after it.
///
/// Events written to connected devices before their commit are often acknowledged before
/// the store writer gets to them: the event's insert and the acknowledgement's delete then
/// sit in the same batch, and neither needs to touch the disk. In a fan-out, where every
/// delivered message also produces a receipt that is acknowledged at once, this removes
/// most of the store's work.
public enum StoreBatch {
    /// `changes` with
    /// - the acknowledgements of each device merged into one, at the place of the first
    ///   (so that space is freed before later changes of the batch need it), acknowledging
    ///   through the highest of them, and
    /// - the events that an acknowledgement of the same device later in the batch covers
    ///   left out (that acknowledgement deletes them, and raises the device's `lastSeq`
    ///   past them anyway), and
    /// - the events and held events that a `withdrawEvent` / `withdrawHeld` later in the
    ///   batch deletes left out (the withdrawal stays: it raises `lastSeq` as the event
    ///   would have, and its delete then finds nothing).
    ///
    /// A `removeDevice` separates two lives of a device: nothing before it is matched with
    /// anything after it. Applying the result leaves the store exactly as applying
    /// `changes` would (for a batch the store accepts).
    public static func compacted(_ changes: [StoreChange]) -> [StoreChange] {
        var result = changes
        compact(&result)
        return result
    }

    /// `compacted`, in place: kept changes are moved, not copied (the writer compacts
    /// hundreds of thousands of changes a second, and copying an enum with strings and
    /// arrays in it costs more than deciding whether to keep it).
    public static func compact(_ changes: inout [StoreChange]) {
        // One backward pass. For each device it tracks the highest acknowledgement still
        // to come in the batch (events at or below it go) and the earliest one seen so far
        // (which absorbs the later ones of the same life of the device).
        struct Acknowledgements {
            var highest: UInt64
            var earliestIndex: Int
        }
        var pending: [DeviceKey: Acknowledgements] = [:]
        var keep = [Bool](repeating: true, count: changes.count)
        var merged: [(index: Int, through: UInt64)] = []
        // Withdrawals still to come in the batch: rare (a message refused after its commit
        // began), so the common case costs one `isEmpty` per event.
        var withdrawnEvents: [DeviceKey: Set<UInt64>] = [:]
        var withdrawnHeld: [String: Set<UInt64>] = [:]
        var dropped = 0
        func settle(_ acknowledgements: Acknowledgements) {
            merged.append((acknowledgements.earliestIndex, acknowledgements.highest))
        }
        // An event an acknowledgement or a withdrawal later in the batch deletes again.
        func isUndoneLater(_ key: DeviceKey, _ seq: UInt64) -> Bool {
            if let later = pending[key], seq <= later.highest { return true }
            return !withdrawnEvents.isEmpty && withdrawnEvents[key]?.contains(seq) == true
        }
        for index in changes.indices.reversed() {
            switch changes[index] {
            case .acknowledge(let user, let device, let through):
                let key = DeviceKey(userID: user, deviceID: device)
                if let later = pending[key] {
                    keep[later.earliestIndex] = false
                    dropped += 1
                    pending[key] = Acknowledgements(highest: max(through, later.highest), earliestIndex: index)
                } else {
                    pending[key] = Acknowledgements(highest: through, earliestIndex: index)
                }
            case .appendEvent(let user, let device, let event):
                if isUndoneLater(DeviceKey(userID: user, deviceID: device), event.seq) {
                    keep[index] = false
                    dropped += 1
                }
            case .claimHeldEvent(let user, let device, let seq, _):
                if isUndoneLater(DeviceKey(userID: user, deviceID: device), seq) {
                    keep[index] = false
                    dropped += 1
                }
            case .withdrawEvent(let user, let device, let seq):
                withdrawnEvents[DeviceKey(userID: user, deviceID: device), default: []].insert(seq)
            case .holdForUser(let user, let event):
                if !withdrawnHeld.isEmpty, withdrawnHeld[user]?.contains(event.seq) == true {
                    keep[index] = false
                    dropped += 1
                }
            case .withdrawHeld(let user, let ordinal):
                withdrawnHeld[user, default: []].insert(ordinal)
            case .removeDevice(let user, let device):
                let key = DeviceKey(userID: user, deviceID: device)
                if let later = pending.removeValue(forKey: key) { settle(later) }
                withdrawnEvents[key] = nil
            default:
                break
            }
        }
        for acknowledgements in pending.values { settle(acknowledgements) }
        for (index, through) in merged {
            guard case .acknowledge(let user, let device, let own) = changes[index], own != through else { continue }
            changes[index] = .acknowledge(user: user, device: device, through: through)
        }
        guard dropped > 0 else { return }
        var kept = 0
        for index in changes.indices where keep[index] {
            if index != kept { changes.swapAt(index, kept) }
            kept += 1
        }
        changes.removeSubrange(kept...)
    }
}
