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

    /// The largest body with an all-empty receipt and the latest time; and the highest
    /// number a store accepts with an empty body.
    public static let bigEvent = StoredEvent(
        seq: 1, type: 0xFF, body: [UInt8](repeating: 0x5A, count: ProtocolLimits.defaultMaxFrameLength),
        receipt: StoredReceipt(sender: "", messageID: "", recipient: ""), createdAt: UInt64.max)
    public static let emptyEvent = StoredEvent(seq: UInt64(Int64.max), type: 0, body: [], createdAt: 0)

    /// A batch of edge values every store must round-trip: `bigEvent` and `emptyEvent` for
    /// device "" of user "zoë 👋", an empty and a NUL-containing id, extreme numbers.
    public static let edgeValues: [StoreChange] = [
        .upsertDevice(user: "zoë 👋", device: "", sessionID: SessionID(high: .max, low: .max), lastSeen: .max),
        .upsertDevice(user: "nul\u{0}inside", device: "d", sessionID: SessionID(high: 0, low: 0), lastSeen: 0),
        .appendEvent(user: "zoë 👋", device: "", event: bigEvent),
        .appendEvent(user: "zoë 👋", device: "", event: emptyEvent),
        .registerPush(user: "zoë 👋", device: "", registration: PushRegistration(platform: "", token: [])),
        .holdForUser(user: "", event: emptyEvent),
        .rememberMessageID(StoredMessageID(sender: "日本", messageID: "\u{0}", serverTime: .max, expiresAt: .max)),
    ]
}
