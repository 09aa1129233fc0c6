import SignalingStore
/// Wake-ups handed over by `submit` and not yet taken by the gateway's thread, already
/// coalesced per device so that a burst of events for one device costs one entry.
/// Used only under the gateway's inbox lock; every operation is O(1) (amortized).
struct SubmissionInbox {
    enum Admission: Equatable {
        /// A new entry; `wasEmpty` tells the caller to wake the gateway's thread (one wake
        /// covers the whole batch that follows).
        case added(wasEmpty: Bool)
        /// Folded into the entry already waiting for the device.
        case merged
        /// `capacity` distinct devices are waiting already.
        case full
        /// The gateway has stopped.
        case closed
    }

    private(set) var wakeUps: [WakeUp] = []
    private var indexByDevice: [DeviceKey: Int] = [:]
    private(set) var isClosed = false

    var count: Int { wakeUps.count }

    mutating func add(_ wakeUp: WakeUp, capacity: Int) -> Admission {
        guard !isClosed else { return .closed }
        let device = wakeUp.device
        if let index = indexByDevice[device] {
            wakeUps[index].absorb(wakeUp)
            return .merged
        }
        guard wakeUps.count < capacity else { return .full }
        indexByDevice[device] = wakeUps.count
        wakeUps.append(wakeUp)
        return .added(wasEmpty: wakeUps.count == 1)
    }

    /// Everything waiting, oldest device first, leaving an empty inbox. O(1): the storage
    /// moves out whole, so the caller can free it after releasing the lock.
    mutating func takeAll() -> SubmissionInbox {
        var taken = SubmissionInbox()
        swap(&self, &taken)
        isClosed = taken.isClosed
        return taken
    }

    /// Refuses every later submission; returns what was still waiting.
    mutating func close() -> [WakeUp] {
        isClosed = true
        let left = wakeUps
        wakeUps = []
        indexByDevice = [:]
        return left
    }
}
