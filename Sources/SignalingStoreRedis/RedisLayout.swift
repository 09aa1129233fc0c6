import SignalingProtocol
import SignalingStore

/// The keys and values the Redis store writes (docs/STORAGE.md, "Redis"). Everything of
/// one user lives under keys that share the Redis Cluster hash tag `{u:USER}`, so they sit
/// in one slot and one Lua script may change them atomically on any shard; a node that
/// takes a user over reads that user's keys and nothing else.
///
/// | key | type | holds |
/// |-----|------|-------|
/// | `voip:schema` | string | the layout version (`schemaVersion`) |
/// | `voip:users` | set | every user with a device, a held event or a message id: what a single node loads at start |
/// | `voip:lease` | string | the node id of the one node that may write (with a TTL; `RedisLease`) |
/// | `voip:fence` | string | on every instance but the first of a sharded store: the node id of the lease holder that fenced it (`RedisFence`) |
/// | `voip:fence-epoch` | string | the fence's term number (on the first instance: the last one handed out) |
/// | `voip:instance` | string | `INDEX/COUNT`: this instance's place in the store's list of instances (`RedisShards`); `rebalance HASH` during a move, `retired` after one (`RedisRebalance`) |
/// | `voip:node:NODE` | string | a cluster node's presence (with a TTL; `RedisNodeLink`, docs/CLUSTER.md) |
/// | `{u:U}:devices` | hash | device id → `DeviceRecord` (counters, session, last seen) |
/// | `{u:U}:q:D` | sorted set | device D's events, one member each: `seq` (20 digits) + `EventRecord` |
/// | `{u:U}:held` | sorted set | events held for U, members as the queues', by ordinal |
/// | `{u:U}:push:D` | hash | device D's push registrations, one per kind: kind → `PushRecord` |
/// | `{u:U}:mid` | hash | message ids U sent, for de-duplication: id → `MessageIDRecord` |
///
/// Sequence numbers are compared inside Redis, by Lua, whose numbers are doubles (exact
/// only to 2^53): so they are stored as 20 zero-padded decimal digits, whose byte order
/// is their numeric order. Queue members all have score 0 and are ordered and ranged by
/// those bytes (ZRANGEBYLEX). Everything else is opaque to Redis and binary (big-endian,
/// `ByteWriter`'s encodings).
enum RedisLayout {
    /// Raise with every change to the keys or the records, and teach `RedisSchema` to
    /// upgrade from the version before.
    static let schemaVersion = 1
    static let schemaKey = "voip:schema"
    static let usersKey = "voip:users"
    /// Which node may write this database (`RedisLease`): its node id, with a TTL. Not a
    /// user's key: a database has one active node (docs/CLUSTER.md).
    static let leaseKey = "voip:lease"
    /// On every instance but the first of a sharded store, what the apply script checks
    /// instead of the lease: the id of the lease holder that fenced the instance last
    /// (`RedisFence`, docs/CLUSTER.md "Fencing: the guarantee").
    static let fenceKey = "voip:fence"
    /// The term number of `fenceKey`; on the first instance, the last term number handed out.
    static let fenceEpochKey = "voip:fence-epoch"
    /// `INDEX/COUNT`: where this database sits in the store's list of instances, written
    /// when the layout is created, so that a reordered or grown list is refused rather
    /// than read with users on the wrong instances (`RedisShards`).
    static let instanceKey = "voip:instance"

    /// `{u:USER}:` with `%` and `}` in the user id escaped as `%25` and `%7D`. A user id may
    /// contain any character; escaping `}` keeps the hash tag the whole id (Redis Cluster
    /// ends a tag at the first `}`), and with `}` escaped the prefix ends unambiguously, so
    /// no two (user, device) pairs share a key.
    static func userPrefix(_ user: String) -> [UInt8] {
        var prefix = Array("{u:".utf8)
        prefix.reserveCapacity(user.utf8.count + 5)
        for byte in user.utf8 {
            switch byte {
            case UInt8(ascii: "%"): prefix += Array("%25".utf8)
            case UInt8(ascii: "}"): prefix += Array("%7D".utf8)
            default: prefix.append(byte)
            }
        }
        prefix += Array("}:".utf8)
        return prefix
    }

    /// The user whose key `key` is (`userPrefix` read back), or nil for a key that is not
    /// a user's (`voip:...`). The tag ends at the first `}`, since `}` in an id is escaped.
    static func user(ofKey key: [UInt8]) -> String? {
        let opening = Array("{u:".utf8)
        guard key.count > opening.count + 1, key.starts(with: opening),
              let close = key[opening.count...].firstIndex(of: UInt8(ascii: "}")),
              close + 1 < key.count, key[close + 1] == UInt8(ascii: ":")
        else { return nil }
        var user: [UInt8] = []
        var index = opening.count
        while index < close {
            if key[index] == UInt8(ascii: "%"), index + 2 < close {
                let escape = key[index...].prefix(3)
                if escape.elementsEqual("%25".utf8) { user.append(UInt8(ascii: "%")); index += 3; continue }
                if escape.elementsEqual("%7D".utf8) { user.append(UInt8(ascii: "}")); index += 3; continue }
            }
            user.append(key[index])
            index += 1
        }
        return String(decoding: user, as: UTF8.self)
    }

    static func devicesKey(_ user: String) -> [UInt8] { userPrefix(user) + Array("devices".utf8) }
    static func heldKey(_ user: String) -> [UInt8] { userPrefix(user) + Array("held".utf8) }
    static func messageIDsKey(_ user: String) -> [UInt8] { userPrefix(user) + Array("mid".utf8) }
    static func queueKey(_ user: String, _ device: String) -> [UInt8] { userPrefix(user) + Array("q:".utf8) + Array(device.utf8) }
    static func pushKey(_ user: String, _ device: String) -> [UInt8] { userPrefix(user) + Array("push:".utf8) + Array(device.utf8) }

    /// Sequence numbers and ordinals the store accepts: as the SQLite store, at most
    /// 2^63 - 1, so that `value + 1` (the exclusive end of a range) always has 20 digits.
    static func checkedSequence(_ value: UInt64, _ what: String) throws(StoreError) -> UInt64 {
        guard value <= UInt64(Int64.max) else {
            throw StoreError(.other, "\(what) \(value) is beyond the store's range (at most \(Int64.max))")
        }
        return value
    }

    /// 20 decimal digits, zero-padded: byte order is numeric order for every UInt64.
    static func digits(_ value: UInt64) -> [UInt8] {
        var digits = [UInt8](repeating: UInt8(ascii: "0"), count: 20)
        var rest = value
        var index = 19
        while rest > 0 {
            digits[index] = UInt8(ascii: "0") + UInt8(rest % 10)
            rest /= 10
            index -= 1
        }
        return digits
    }

    static func number(fromDigits digits: ArraySlice<UInt8>) -> UInt64? {
        guard digits.count == 20 else { return nil }
        var value: UInt64 = 0
        for byte in digits {
            guard byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9") else { return nil }
            let (shifted, overflow1) = value.multipliedReportingOverflow(by: 10)
            let (added, overflow2) = shifted.addingReportingOverflow(UInt64(byte - UInt8(ascii: "0")))
            guard !overflow1 && !overflow2 else { return nil }
            value = added
        }
        return value
    }
}

/// A device's entry in `{u:U}:devices`: `ackedSeq` (20 digits), `lastSeq` (20 digits),
/// the session id (16 bytes), `lastSeen` (u64): 64 bytes. The Lua script raises the
/// counters in place (bytes 1-40) and rewrites the rest on an upsert.
enum DeviceRecord {
    static let length = 64

    /// The bytes an upsert replaces: session id and last seen.
    static func sessionPart(_ sessionID: SessionID, lastSeen: UInt64) -> [UInt8] {
        var writer = ByteWriter(capacity: 24)
        writer.sessionID(sessionID)
        writer.u64(lastSeen)
        return writer.bytes
    }

    static func decode(_ bytes: [UInt8], user: String, device: String) throws(StoreError) -> StoredDevice {
        // The stored ackedSeq is checked but not read back: a snapshot derives it
        // (StoredDevice.ackedSeq).
        guard bytes.count == length,
              RedisLayout.number(fromDigits: bytes[0..<20]) != nil,
              let last = RedisLayout.number(fromDigits: bytes[20..<40])
        else { throw StoreError(.corrupt, "the record of device \(user)/\(device) is not a voipserver device record") }
        var reader = RecordReader(bytes[40...])
        let sessionID = SessionID(high: reader.u64(), low: reader.u64())
        return StoredDevice(userID: user, deviceID: device, sessionID: sessionID, lastSeq: last, lastSeen: reader.u64())
    }
}

/// An event as a queue (or held) member: its seq or ordinal (20 digits) followed by type
/// (u8), created at (u64), a receipt flag (u8) and, if 1, sender, message id and recipient
/// (each u32 length + UTF-8), then the body to the end. Claiming a held event copies the
/// member's bytes after the ordinal, so the script never parses one.
enum EventRecord {
    /// The member's bytes after the number.
    static func tail(of event: StoredEvent) -> [UInt8] {
        var writer = ByteWriter(capacity: event.body.count + 16)
        writer.u8(event.type)
        writer.u64(event.createdAt)
        if let receipt = event.receipt {
            writer.u8(1)
            for text in [receipt.sender, receipt.messageID, receipt.recipient] { writer.blob(Array(text.utf8)) }
        } else {
            writer.u8(0)
        }
        writer.raw(event.body)
        return writer.bytes
    }

    static func decode(_ member: [UInt8], in key: String) throws(StoreError) -> StoredEvent {
        func corrupt() -> StoreError { StoreError(.corrupt, "a member of \(key) is not a voipserver event record") }
        guard member.count >= 30, let seq = RedisLayout.number(fromDigits: member[0..<20]) else { throw corrupt() }
        var reader = RecordReader(member[20...])
        let type = reader.u8()
        let createdAt = reader.u64()
        var receipt: StoredReceipt?
        switch reader.u8() {
        case 0: break
        case 1:
            guard let sender = reader.text(), let messageID = reader.text(), let recipient = reader.text() else { throw corrupt() }
            receipt = StoredReceipt(sender: sender, messageID: messageID, recipient: recipient)
        default: throw corrupt()
        }
        guard !reader.failed else { throw corrupt() }
        return StoredEvent(seq: seq, type: type, body: reader.rest(), receipt: receipt, createdAt: createdAt)
    }

    /// Only the number and the body (`EventBodySource`).
    static func seqAndBody(_ member: [UInt8], in key: String) throws(StoreError) -> (seq: UInt64, body: [UInt8]) {
        let event = try decode(member, in: key)
        return (event.seq, event.body)
    }
}

/// A message id's entry in `{u:SENDER}:mid`: server time and expiry, u64 each.
enum MessageIDRecord {
    static func encode(_ remembered: StoredMessageID) -> [UInt8] {
        var writer = ByteWriter(capacity: 16)
        writer.u64(remembered.serverTime)
        writer.u64(remembered.expiresAt)
        return writer.bytes
    }

    static func decode(_ bytes: [UInt8], sender: String, messageID: String) throws(StoreError) -> StoredMessageID {
        guard bytes.count == 16 else { throw StoreError(.corrupt, "the record of message id \(sender)/\(messageID) is not 16 bytes") }
        var reader = RecordReader(bytes[...])
        return StoredMessageID(sender: sender, messageID: messageID, serverTime: reader.u64(), expiresAt: reader.u64())
    }
}

/// A push registration in `{u:U}:push:D`, under its kind (`PushTokenKind.rawValue`, the
/// hash's field: one registration per kind): platform, token, environment and topic, each
/// u32 length + bytes.
enum PushRecord {
    static func encode(_ registration: PushRegistration) -> [UInt8] {
        var writer = ByteWriter(capacity: registration.token.count + 32)
        writer.blob(Array(registration.platform.utf8))
        writer.blob(registration.token)
        writer.blob(Array(registration.environment.utf8))
        writer.blob(Array(registration.topic.utf8))
        return writer.bytes
    }

    static func decode(_ bytes: [UInt8], user: String, device: String) throws(StoreError) -> PushRegistration {
        var reader = RecordReader(bytes[...])
        guard let platform = reader.text(), let token = reader.blob(), let environment = reader.text(), let topic = reader.text(),
              !reader.failed, reader.isAtEnd
        else {
            throw StoreError(.corrupt, "a push registration of \(user)/\(device) is not a voipserver push record")
        }
        return PushRegistration(platform: platform, token: token, environment: environment, topic: topic)
    }
}

/// Reads the records' big-endian fields; a short record sets `failed` (and reads zeros)
/// instead of trapping, so one check at the end covers every field.
struct RecordReader {
    private let bytes: ArraySlice<UInt8>
    private var offset: Int
    private(set) var failed = false

    init(_ bytes: ArraySlice<UInt8>) {
        self.bytes = bytes
        offset = bytes.startIndex
    }

    var isAtEnd: Bool { offset == bytes.endIndex }

    private mutating func take(_ count: Int) -> ArraySlice<UInt8>? {
        guard !failed, count >= 0, bytes.endIndex - offset >= count else {
            failed = true
            return nil
        }
        defer { offset += count }
        return bytes[offset..<(offset + count)]
    }

    mutating func u8() -> UInt8 { take(1)?.first ?? 0 }

    mutating func u64() -> UInt64 { take(8)?.reduce(0) { $0 << 8 | UInt64($1) } ?? 0 }

    mutating func blob() -> [UInt8]? {
        guard let count = take(4)?.reduce(0, { $0 << 8 | Int($1) }), let value = take(count) else { return nil }
        return Array(value)
    }

    mutating func text() -> String? { blob().map { String(decoding: $0, as: UTF8.self) } }

    mutating func rest() -> [UInt8] {
        defer { offset = bytes.endIndex }
        return Array(bytes[offset...])
    }
}
