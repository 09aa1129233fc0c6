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
    ///   past them anyway).
    ///
    /// A `removeDevice` separates two lives of a device: nothing before it is matched with
    /// anything after it. Applying the result leaves the store exactly as applying
    /// `changes` would (for a batch the store accepts).
    public static func compacted(_ changes: [StoreChange]) -> [StoreChange] {
        // Backwards: for each acknowledgement, the highest one of the same device from
        // there to the end of the device's life in the batch; events below it go.
        var highestLater: [DeviceKey: UInt64] = [:]
        var mergedThrough: [Int: UInt64] = [:]
        var keep = [Bool](repeating: true, count: changes.count)
        var acknowledgements = 0
        for index in changes.indices.reversed() {
            switch changes[index] {
            case .acknowledge(let user, let device, let through):
                let key = DeviceKey(user: user, device: device)
                let highest = max(through, highestLater[key] ?? 0)
                highestLater[key] = highest
                mergedThrough[index] = highest
                acknowledgements += 1
            case .appendEvent(let user, let device, let event):
                if let later = highestLater[DeviceKey(user: user, device: device)], event.seq <= later {
                    keep[index] = false
                }
            case .removeDevice(let user, let device):
                highestLater[DeviceKey(user: user, device: device)] = nil
            default:
                break
            }
        }
        guard acknowledgements > 0 else { return changes }
        // Forwards: the first acknowledgement of each life carries the merged one.
        var acknowledged: Set<DeviceKey> = []
        var result: [StoreChange] = []
        result.reserveCapacity(changes.count)
        for index in changes.indices where keep[index] {
            switch changes[index] {
            case .acknowledge(let user, let device, _):
                let key = DeviceKey(user: user, device: device)
                if acknowledged.insert(key).inserted {
                    result.append(.acknowledge(user: user, device: device, through: mergedThrough[index]!))
                }
            case .removeDevice(let user, let device):
                acknowledged.remove(DeviceKey(user: user, device: device))
                result.append(changes[index])
            default:
                result.append(changes[index])
            }
        }
        return result
    }

    private struct DeviceKey: Hashable {
        var user: String
        var device: String
    }
}
