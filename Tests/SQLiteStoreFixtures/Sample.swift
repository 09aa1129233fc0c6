import SignalingProtocol
import SignalingStore

/// Records for the store tests (SQLite and Redis), with defaults so each test spells out
/// only what it is about.
public enum Sample {
    public static func session(_ n: UInt64) -> SessionID { SessionID(high: n, low: ~n) }

    public static func event(_ seq: UInt64, bodySize: Int = 24, receipt: StoredReceipt? = nil, createdAt: UInt64 = 1_800_000_000_000) -> StoredEvent {
        StoredEvent(seq: seq, type: 0x41, body: (0..<bodySize).map { UInt8(truncatingIfNeeded: seq &* 31 &+ UInt64($0)) },
                    receipt: receipt, createdAt: createdAt)
    }

    public static func device(_ user: String, _ device: String, session: UInt64 = 1, lastSeen: UInt64 = 1_800_000_000_000) -> StoreChange {
        .upsertDevice(user: user, device: device, sessionID: Sample.session(session), lastSeen: lastSeen)
    }

    public static func append(_ user: String, _ device: String, _ seq: UInt64, bodySize: Int = 24) -> StoreChange {
        .appendEvent(user: user, device: device, event: event(seq, bodySize: bodySize))
    }
}
