import SignalingStore
import SignalingSupport

/// Reads everything stored into a `StoredSnapshot`: one ordered scan per table inside one
/// read transaction, so the parts are consistent with each other and the cost is linear
/// in the number of rows, however many devices there are.
struct SnapshotReader {
    let connection: SQLiteConnection
    let logger: Logger

    func read() throws(StoreError) -> StoredSnapshot {
        try connection.execute("BEGIN")
        defer { try? connection.execute("COMMIT") }  // read-only: nothing to lose
        var snapshot = StoredSnapshot()
        snapshot.devices = try readDevices()
        snapshot.held = try readHeldEvents()
        snapshot.messageIDs = try readMessageIDs()
        return snapshot
    }

    /// Devices in (user, device) order, each with its events in seq order.
    private func readDevices() throws(StoreError) -> [StoredDevice] {
        var devices: [StoredDevice] = []
        var indexByKey: [DeviceKey: Int] = [:]
        let deviceRows = try connection.prepare("""
            SELECT user_id, device_id, session_id, last_seq, last_seen
            FROM devices ORDER BY user_id, device_id
            """, as: "read devices")
        defer { deviceRows.reset() }
        while try deviceRows.step() {
            let user = deviceRows.text(0)
            let device = deviceRows.text(1)
            guard let sessionID = StoredValue.sessionID(from: deviceRows.blob(2)) else {
                throw StoreError(.corrupt, "\(connection.path): device \(user)/\(device) has a session id that is not 16 bytes")
            }
            indexByKey[DeviceKey(userID: user, deviceID: device)] = devices.count
            devices.append(StoredDevice(
                userID: user, deviceID: device, sessionID: sessionID,
                lastSeq: StoredValue.sequence(from: deviceRows.int64(3)),
                lastSeen: StoredValue.timestamp(from: deviceRows.int64(4))))
        }

        let pushRows = try connection.prepare("""
            SELECT user_id, device_id, platform, token, environment, topic
            FROM push_registrations ORDER BY user_id, device_id
            """, as: "read push registrations")
        defer { pushRows.reset() }
        while try pushRows.step() {
            let key = DeviceKey(userID: pushRows.text(0), deviceID: pushRows.text(1))
            guard let index = indexByKey[key] else { continue }  // impossible with foreign keys
            devices[index].pushRegistrations.register(PushRegistration(
                platform: pushRows.text(2), token: pushRows.blob(3), environment: pushRows.text(4), topic: pushRows.text(5)))
        }

        let eventRows = try connection.prepare("""
            SELECT user_id, device_id, seq, type, body, receipt_sender, receipt_message_id, receipt_recipient, created_at
            FROM device_events ORDER BY user_id, device_id, seq
            """, as: "read device events")
        defer { eventRows.reset() }
        // Rows arrive grouped by device: look the device up once per group.
        var current: (key: DeviceKey, index: Int?)?
        var orphans = 0
        while try eventRows.step() {
            let key = DeviceKey(userID: eventRows.text(0), deviceID: eventRows.text(1))
            if current?.key != key { current = (key, indexByKey[key]) }
            guard let index = current?.index else {
                orphans += 1  // impossible while foreign keys are enforced; never fatal
                continue
            }
            devices[index].events.append(try Self.event(from: eventRows, seqColumn: 2, path: connection.path))
        }
        if orphans > 0 {
            logger.warning("store_orphan_events", ["path": connection.path, "events": orphans])
        }
        return devices
    }

    /// Held events by user, each user's in ordinal order.
    private func readHeldEvents() throws(StoreError) -> [String: [StoredEvent]] {
        var held: [String: [StoredEvent]] = [:]
        let rows = try connection.prepare("""
            SELECT user_id, ordinal, type, body, receipt_sender, receipt_message_id, receipt_recipient, created_at
            FROM held_events ORDER BY user_id, ordinal
            """, as: "read held events")
        defer { rows.reset() }
        while try rows.step() {
            held[rows.text(0), default: []].append(try Self.event(from: rows, seqColumn: 1, path: connection.path))
        }
        return held
    }

    /// Message ids in (sender, message id) order, each id's latest record only: the table
    /// is in server-time order (schema version 3). It holds one record per id (version 4
    /// removed the superseded ones older servers left); should a file hold two, the
    /// later wins.
    private func readMessageIDs() throws(StoreError) -> [StoredMessageID] {
        var latest: [StoredMessageKey: StoredMessageID] = [:]
        let rows = try connection.prepare("""
            SELECT sender_id, message_id, server_time, expires_at FROM message_ids
            """, as: "read message ids")
        defer { rows.reset() }
        while try rows.step() {
            let record = StoredMessageID(
                sender: rows.text(0), messageID: rows.text(1),
                serverTime: StoredValue.timestamp(from: rows.int64(2)),
                expiresAt: StoredValue.timestamp(from: rows.int64(3)))
            let key = StoredMessageKey(sender: record.sender, messageID: record.messageID)
            if let earlier = latest[key], earlier.serverTime > record.serverTime { continue }
            latest[key] = record
        }
        var messageIDs = Array(latest.values)
        StoredSnapshot.sortMessageIDs(&messageIDs)
        return messageIDs
    }

    /// An event from columns seq, type, body, receipt sender, message id, recipient,
    /// created_at, starting at `seqColumn`.
    private static func event(from row: SQLiteStatement, seqColumn first: Int32, path: String) throws(StoreError) -> StoredEvent {
        let seq = StoredValue.sequence(from: row.int64(first))
        guard let type = UInt8(exactly: row.int64(first + 1)) else {
            throw StoreError(.corrupt, "\(path): event \(seq) has type \(row.int64(first + 1)), not a frame type")
        }
        var receipt: StoredReceipt?
        if let sender = row.optionalText(first + 3), let messageID = row.optionalText(first + 4),
           let recipient = row.optionalText(first + 5) {
            receipt = StoredReceipt(sender: sender, messageID: messageID, recipient: recipient)
        }
        return StoredEvent(
            seq: seq, type: type, body: row.blob(first + 2), receipt: receipt,
            createdAt: StoredValue.timestamp(from: row.int64(first + 6)))
    }
}
