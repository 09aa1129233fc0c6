/// Who is who in a load run: which connections each worker process holds, the user and
/// device ids they log in as, and the loopback source address each one binds to.
///
/// Everything is derived from numbers, so a worker stores no strings per connection:
/// idle device g (0 ≤ g < idleDevices) is user "d<g>", device "p", and lives in worker
/// g mod workers at slot g / workers. Connection slots inside a worker are laid out as
///
///     [ idle devices | probe sender | fan-out sender | fan-out devices ]
public struct WorkloadLayout: Sendable, Equatable {
    public enum Role: Sendable, Equatable {
        /// An idle mobile device: receives push-latency probes.
        case idleDevice(global: Int)
        /// Sends the push-latency probes (messages and call invites) of this worker.
        case probeSender
        /// Sends fan-out messages to the fan-out users.
        case fanoutSender
        /// One of the fan-out users' many devices.
        case fanoutDevice(global: Int)
    }

    /// The user every fan-out device belongs to when there is one fan-out user.
    public static let fanoutUser = "fan"

    /// The user fan-out device `global` belongs to: with one fan-out user `fan`, else
    /// `fan<global mod users>` (devices dealt round-robin, so each user has an equal share
    /// when the users divide the devices: `--fanout-users`). Users with different names
    /// land on different routing shards, so such a fan-out spreads over the server's loops.
    public static func fanoutUser(ofDevice global: Int, users: Int) -> String {
        users == 1 ? fanoutUser : "fan\(global % users)"
    }

    public let worker: Int
    public let workerCount: Int
    public let idleDevicesTotal: Int
    public let fanoutDevicesTotal: Int
    /// The fan-out users the devices are dealt to (`fanoutUser(ofDevice:users:)`).
    public let fanoutUserCount: Int
    public let sourceAddressCount: Int

    public init(worker: Int, workerCount: Int, idleDevices: Int, fanoutDevices: Int, fanoutUsers: Int = 1, sourceAddresses: Int) {
        precondition(workerCount > 0 && (0..<workerCount).contains(worker) && sourceAddresses > 0 && fanoutUsers > 0)
        self.worker = worker
        self.workerCount = workerCount
        self.idleDevicesTotal = idleDevices
        self.fanoutDevicesTotal = fanoutDevices
        self.fanoutUserCount = fanoutUsers
        self.sourceAddressCount = sourceAddresses
    }

    /// The devices of each fan-out user (the users divide the devices: checked by
    /// `LoadConfiguration.validate`): how many receipts complete one fan-out message.
    public var fanoutDevicesPerUser: Int { fanoutDevicesTotal / fanoutUserCount }

    /// The recipient of this worker's fan-out message number `number`: the users in turn,
    /// each worker starting at its own share of them, so the workers' senders do not all
    /// address the same user at once.
    public func fanoutRecipient(ofMessage number: UInt64) -> String {
        guard fanoutUserCount > 1 else { return Self.fanoutUser }
        let first = worker * fanoutUserCount / workerCount
        return "fan\((first + Int(number % UInt64(fanoutUserCount))) % fanoutUserCount)"
    }

    /// How many of `total` items, dealt round-robin, land on `worker`.
    public static func share(of total: Int, worker: Int, workers: Int) -> Int {
        total / workers + (worker < total % workers ? 1 : 0)
    }

    public var idleCount: Int { Self.share(of: idleDevicesTotal, worker: worker, workers: workerCount) }
    public var fanoutDeviceCount: Int { Self.share(of: fanoutDevicesTotal, worker: worker, workers: workerCount) }

    public var idleSlots: Range<Int> { 0..<idleCount }
    public var probeSenderSlot: Int { idleCount }
    public var fanoutSenderSlot: Int { idleCount + 1 }
    public var fanoutDeviceSlots: Range<Int> { (idleCount + 2)..<(idleCount + 2 + fanoutDeviceCount) }
    public var slotCount: Int { idleCount + 2 + fanoutDeviceCount }

    public func role(ofSlot slot: Int) -> Role {
        if slot < idleCount { return .idleDevice(global: slot * workerCount + worker) }
        if slot == probeSenderSlot { return .probeSender }
        if slot == fanoutSenderSlot { return .fanoutSender }
        return .fanoutDevice(global: (slot - fanoutDeviceSlots.lowerBound) * workerCount + worker)
    }

    public static func idleUser(_ global: Int) -> String { "d\(global)" }

    /// Push user `index` (`--push-users`): registered for push, never connected by the tool.
    public static func pushUser(_ index: Int) -> String { "w\(index)" }

    /// (userId, deviceId) for a slot. Short enough (≤ 15 bytes) to stay inline in Swift
    /// strings on both sides.
    public func identity(ofSlot slot: Int) -> (user: String, device: String) {
        switch role(ofSlot: slot) {
        case .idleDevice(let global): return (Self.idleUser(global), "p")
        case .probeSender: return ("ps\(worker)", "p")
        case .fanoutSender: return ("fs\(worker)", "p")
        case .fanoutDevice(let global): return (Self.fanoutUser(ofDevice: global, users: fanoutUserCount), "f\(global)")
        }
    }

    /// A number unique to the connection across all workers, used to spread sources.
    func connectionNumber(ofSlot slot: Int) -> Int {
        switch role(ofSlot: slot) {
        case .idleDevice(let global): return global
        case .probeSender: return idleDevicesTotal + worker
        case .fanoutSender: return idleDevicesTotal + workerCount + worker
        case .fanoutDevice(let global): return idleDevicesTotal + 2 * workerCount + global
        }
    }

    /// The IPv4 source address (host byte order) the slot binds to: consecutive
    /// connections go to consecutive addresses from 127.0.0.2 upward, so no address
    /// needs more than ⌈connections / sourceAddresses⌉ ephemeral ports, and the
    /// server's per-address limit sees an even spread.
    public func sourceAddress(ofSlot slot: Int) -> UInt32 {
        Self.sourceAddress(index: connectionNumber(ofSlot: slot) % sourceAddressCount)
    }

    public static func sourceAddress(index: Int) -> UInt32 {
        (127 << 24) + 2 + UInt32(index)
    }

    /// The most addresses the plan may use: all of 127.0.0.2 ... 127.255.255.254.
    public static let maximumSourceAddresses = (1 << 24) - 3
}

