import SignalingProtocol
import SignalingStore

/// The batches the crash-test child commits, the same on every call, so that the test can
/// compute what each committed batch left behind. Batch 0 creates the devices; every
/// later batch mixes every kind of change: events of varying sizes for each device,
/// acknowledgements, held events and their release, message ids remembered and forgotten.
public enum CrashWorkload {
    public static let devices: [(user: String, device: String)] = [
        ("alice", "phone"), ("alice", "tablet"), ("bob", "phone"), ("dave", "laptop"), ("erin", "phone"),
    ]
    /// Events appended per device per batch.
    public static let eventsPerBatch: UInt64 = 3

    public static func batch(_ number: Int) -> [StoreChange] {
        let n = UInt64(number)
        if number == 0 {
            return devices.enumerated().flatMap { index, device -> [StoreChange] in
                [.upsertDevice(user: device.user, device: device.device,
                               sessionID: SessionID(high: UInt64(index), low: 0xFEED), lastSeen: 1),
                 .registerPush(user: device.user, device: device.device,
                               registration: PushRegistration(platform: "apns", token: [UInt8(index), 1, 2, 3]))]
            }
        }
        var changes: [StoreChange] = []
        for (index, device) in devices.enumerated() {
            for k in 1...eventsPerBatch {
                let seq = (n - 1) * eventsPerBatch + k
                let size = Int((n * 7 + UInt64(index) * 13 + k * 31) % 1500) + 1
                let receipt = k == 1 ? StoredReceipt(sender: "carol", messageID: "m\(n)", recipient: device.user) : nil
                changes.append(.appendEvent(user: device.user, device: device.device, event: StoredEvent(
                    seq: seq, type: 0x40 + UInt8(k), body: [UInt8](repeating: UInt8(truncatingIfNeeded: n + k), count: size),
                    receipt: receipt, createdAt: 1_800_000_000_000 + n)))
            }
            // Every device but the first acknowledges the previous batch's events, so its
            // queue stays short while the first one's grows.
            if index > 0 && n >= 2 {
                changes.append(.acknowledge(user: device.user, device: device.device, through: (n - 1) * eventsPerBatch))
            }
        }
        let touched = devices[number % devices.count]
        changes.append(.upsertDevice(user: touched.user, device: touched.device,
                                     sessionID: SessionID(high: n, low: n), lastSeen: n))
        changes.append(.holdForUser(user: "frank", event: StoredEvent(
            seq: n, type: 0x41, body: Array("held \(n)".utf8), createdAt: 1_800_000_000_000 + n)))
        if n > 3 { changes.append(.releaseHeld(user: "frank", through: n - 3)) }
        changes.append(.rememberMessageID(StoredMessageID(
            sender: "carol", messageID: "m\(n)", serverTime: 1_800_000_000_000 + n, expiresAt: 1_800_086_400_000 + n)))
        if n > 10 { changes.append(.forgetMessageID(sender: "carol", messageID: "m\(n - 10)", serverTime: 1_800_000_000_000 + n - 10)) }
        return changes
    }
}
