import CSQLite
import SignalingStore

/// Applies batches of `StoreChange`s, each in one transaction, with statements prepared
/// once per connection and re-used for every change of every batch.
///
/// A device's `last_seq` only ever rises, so the raises a batch makes are collected and
/// written once per device at the end of the batch, instead of one UPDATE per event and per
/// acknowledgement; and a raise that does not raise (the numbers were reserved before) writes
/// nothing. `acked_seq` is no longer written: a device's acknowledged numbers follow from
/// its stored events (`StoredDevice.ackedSeq`), and writing each acknowledgement's number
/// put one row of `devices`, a page of the WAL, into the commit for every message: more
/// than half of the writer's CPU for 1:1 messages to many devices (issue 16).
final class ChangeWriter {
    private let connection: SQLiteConnection

    /// SQLITE_CONSTRAINT_FOREIGNKEY (a macro Swift does not import).
    private static let foreignKeyViolation = SQLITE_CONSTRAINT | (3 << 8)

    /// The highest `last_seq` the current batch raises each device to.
    private var counterRaises: [DeviceKey: Int64] = [:]

    private let begin: SQLiteStatement
    private let commit: SQLiteStatement
    private let rollback: SQLiteStatement

    private let upsertDevice: SQLiteStatement
    private let insertDeviceEvent: SQLiteStatement
    private let deleteAcknowledgedEvents: SQLiteStatement
    private let raiseCounters: SQLiteStatement
    private let deleteDeviceEvents: SQLiteStatement
    private let deleteDevice: SQLiteStatement
    private let insertHeldEvent: SQLiteStatement
    private let copyHeldEvent: SQLiteStatement
    private let deleteReleasedHeldEvents: SQLiteStatement
    private let deleteDeviceEvent: SQLiteStatement
    private let deleteHeldEvent: SQLiteStatement
    private let upsertMessageID: SQLiteStatement
    private let deleteMessageID: SQLiteStatement
    private let upsertPushRegistration: SQLiteStatement
    private let deletePushRegistration: SQLiteStatement
    private let deleteDevicePushRegistrations: SQLiteStatement

    init(connection: SQLiteConnection) throws(StoreError) {
        self.connection = connection
        // IMMEDIATE takes the write lock at once: a lock conflict (a backup writing, a
        // second process) shows at BEGIN, not halfway through the batch.
        begin = try connection.prepare("BEGIN IMMEDIATE", as: "begin")
        commit = try connection.prepare("COMMIT", as: "commit")
        rollback = try connection.prepare("ROLLBACK", as: "rollback")

        upsertDevice = try connection.prepare("""
            INSERT INTO devices (user_id, device_id, session_id, acked_seq, last_seq, last_seen)
            VALUES (?1, ?2, ?3, 0, 0, ?4)
            ON CONFLICT (user_id, device_id) DO UPDATE
            SET session_id = excluded.session_id, last_seen = excluded.last_seen
            """, as: "upsert device")
        insertDeviceEvent = try connection.prepare("""
            INSERT INTO device_events (user_id, device_id, seq, type, body,
                                       receipt_sender, receipt_message_id, receipt_recipient, created_at)
            VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
            """, as: "insert device event")
        deleteAcknowledgedEvents = try connection.prepare("""
            DELETE FROM device_events WHERE user_id = ?1 AND device_id = ?2 AND seq <= ?3
            """, as: "delete acknowledged events")
        // An acknowledgement raises last_seq too: a restarted server continues the sequence
        // after last_seq, and numbers at or below an acknowledged one would be dropped by the
        // client as already processed. The condition leaves the row (and its page) alone
        // when the number was reserved already, as it usually is (acked_seq keeps whatever
        // an older version wrote; it is not read).
        raiseCounters = try connection.prepare("""
            UPDATE devices SET last_seq = ?3 WHERE user_id = ?1 AND device_id = ?2 AND last_seq < ?3
            """, as: "raise last_seq")
        deleteDeviceEvents = try connection.prepare("""
            DELETE FROM device_events WHERE user_id = ?1 AND device_id = ?2
            """, as: "delete device events")
        deleteDevice = try connection.prepare("""
            DELETE FROM devices WHERE user_id = ?1 AND device_id = ?2
            """, as: "delete device")
        insertHeldEvent = try connection.prepare("""
            INSERT INTO held_events (user_id, ordinal, type, body,
                                     receipt_sender, receipt_message_id, receipt_recipient, created_at)
            VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
            """, as: "insert held event")
        // The body comes from the held row, not from the server, which may have dropped it
        // from memory (`StoreChange.claimHeldEvent`).
        copyHeldEvent = try connection.prepare("""
            INSERT INTO device_events (user_id, device_id, seq, type, body,
                                       receipt_sender, receipt_message_id, receipt_recipient, created_at)
            SELECT user_id, ?2, ?3, type, body, receipt_sender, receipt_message_id, receipt_recipient, created_at
            FROM held_events WHERE user_id = ?1 AND ordinal = ?4
            """, as: "copy held event")
        deleteReleasedHeldEvents = try connection.prepare("""
            DELETE FROM held_events WHERE user_id = ?1 AND ordinal <= ?2
            """, as: "delete released held events")
        deleteDeviceEvent = try connection.prepare("""
            DELETE FROM device_events WHERE user_id = ?1 AND device_id = ?2 AND seq = ?3
            """, as: "delete device event")
        deleteHeldEvent = try connection.prepare("""
            DELETE FROM held_events WHERE user_id = ?1 AND ordinal = ?2
            """, as: "delete held event")
        // Keyed by server time first (schema version 3): ids are remembered in about the
        // order of their server times and forgotten oldest first, so both write the ends of
        // the B-tree, where a key of (sender, id) put each random id (a UUID) on a random
        // page: a page read and a page of WAL per message, twice (issue 16).
        upsertMessageID = try connection.prepare("""
            INSERT INTO message_ids (server_time, sender_id, message_id, expires_at)
            VALUES (?3, ?1, ?2, ?4)
            ON CONFLICT (server_time, sender_id, message_id) DO UPDATE SET expires_at = excluded.expires_at
            """, as: "upsert message id")
        deleteMessageID = try connection.prepare("""
            DELETE FROM message_ids WHERE server_time = ?3 AND sender_id = ?1 AND message_id = ?2
            """, as: "delete message id")
        upsertPushRegistration = try connection.prepare("""
            INSERT INTO push_registrations (user_id, device_id, kind, platform, token, environment, topic)
            VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
            ON CONFLICT (user_id, device_id, kind) DO UPDATE
            SET platform = excluded.platform, token = excluded.token,
                environment = excluded.environment, topic = excluded.topic
            """, as: "upsert push registration")
        deletePushRegistration = try connection.prepare("""
            DELETE FROM push_registrations WHERE user_id = ?1 AND device_id = ?2 AND kind = ?3
            """, as: "delete push registration")
        deleteDevicePushRegistrations = try connection.prepare("""
            DELETE FROM push_registrations WHERE user_id = ?1 AND device_id = ?2
            """, as: "delete device push registrations")
    }

    /// Applies the changes in one transaction: all of them, or (on any error) none.
    /// The connection is left ready for the next batch either way.
    func apply(_ changes: [StoreChange]) throws(StoreError) {
        guard !changes.isEmpty else { return }
        // A transaction left open by a ROLLBACK that itself failed (an I/O error) would
        // make this BEGIN fail forever; finish it first.
        if !connection.isAutocommit { rollBack() }
        try begin.run()
        // Not keeping the capacity: a batch of a ramp's or a storm's handshakes would leave
        // a table for thousands of devices allocated for ever (memory per idle connection
        // is a target), and allocating one per batch costs little next to the batch.
        counterRaises.removeAll()
        do throws(StoreError) {
            for (index, change) in changes.enumerated() {
                do throws(StoreError) {
                    try write(change)
                } catch {
                    throw StoreError(error.kind, "change \(index + 1) of \(changes.count) (\(change.summary)): \(error.message)")
                }
            }
            try writeCounterRaises()
            try commit.run()
        } catch {
            rollBack()
            throw error
        }
    }

    private func raise(_ user: String, _ device: String, lastSeq: Int64) {
        let key = DeviceKey(userID: user, deviceID: device)
        counterRaises[key] = max(counterRaises[key] ?? 0, lastSeq)
    }

    private func writeCounterRaises() throws(StoreError) {
        for (key, lastSeq) in counterRaises {
            try raiseCounters.bind(1, key.userID)
            try raiseCounters.bind(2, key.deviceID)
            try raiseCounters.bind(3, lastSeq)
            try raiseCounters.run()
        }
    }

    /// After SQLITE_FULL, SQLITE_IOERR or SQLITE_NOMEM SQLite may have rolled back
    /// already; otherwise the transaction is still open and is rolled back here.
    private func rollBack() {
        guard !connection.isAutocommit else { return }
        try? rollback.run()
    }

    private func write(_ change: StoreChange) throws(StoreError) {
        switch change {
        case .upsertDevice(let user, let device, let sessionID, let lastSeen):
            try upsertDevice.bind(1, user)
            try upsertDevice.bind(2, device)
            try upsertDevice.bind(3, StoredValue.bytes(of: sessionID))
            try upsertDevice.bind(4, StoredValue.timestamp(lastSeen))
            try upsertDevice.run()

        case .appendEvent(let user, let device, let event):
            let seq = try StoredValue.sequence(event.seq, "seq")
            try insertDeviceEvent.bind(1, user)
            try insertDeviceEvent.bind(2, device)
            try insertDeviceEvent.bind(3, seq)
            try bindEventFields(of: event, to: insertDeviceEvent, from: 4)
            do throws(StoreError) {
                try insertDeviceEvent.run()
            } catch where connection.extendedErrorCode == Self.foreignKeyViolation {
                throw StoreError(.other, "no such device; a device is stored (upsertDevice) before its events")
            }
            raise(user, device, lastSeq: seq)

        case .claimHeldEvent(let user, let device, let seq, let ordinal):
            let seq = try StoredValue.sequence(seq, "seq")
            try copyHeldEvent.bind(1, user)
            try copyHeldEvent.bind(2, device)
            try copyHeldEvent.bind(3, seq)
            try copyHeldEvent.bind(4, try StoredValue.sequence(ordinal, "ordinal"))
            do throws(StoreError) {
                try copyHeldEvent.run()
            } catch where connection.extendedErrorCode == Self.foreignKeyViolation {
                throw StoreError(.other, "no such device; a device is stored (upsertDevice) before its events")
            }
            raise(user, device, lastSeq: seq)

        case .acknowledge(let user, let device, let through):
            let through = try StoredValue.sequence(through, "acknowledged seq")
            try deleteAcknowledgedEvents.bind(1, user)
            try deleteAcknowledgedEvents.bind(2, device)
            try deleteAcknowledgedEvents.bind(3, through)
            try deleteAcknowledgedEvents.run()
            raise(user, device, lastSeq: through)

        case .reserveSequence(let user, let device, let through):
            raise(user, device, lastSeq: try StoredValue.sequence(through, "reserved seq"))

        case .removeDevice(let user, let device):
            // Raises for this life of the device die with it (a later upsertDevice starts a
            // new life at zero).
            counterRaises[DeviceKey(userID: user, deviceID: device)] = nil
            try deleteDeviceEvents.bind(1, user)
            try deleteDeviceEvents.bind(2, device)
            try deleteDeviceEvents.run()
            try deleteDevicePushRegistrations.bind(1, user)
            try deleteDevicePushRegistrations.bind(2, device)
            try deleteDevicePushRegistrations.run()
            try deleteDevice.bind(1, user)
            try deleteDevice.bind(2, device)
            try deleteDevice.run()

        case .holdForUser(let user, let event):
            try insertHeldEvent.bind(1, user)
            try insertHeldEvent.bind(2, try StoredValue.sequence(event.seq, "ordinal"))
            try bindEventFields(of: event, to: insertHeldEvent, from: 3)
            try insertHeldEvent.run()

        case .releaseHeld(let user, let through):
            try deleteReleasedHeldEvents.bind(1, user)
            try deleteReleasedHeldEvents.bind(2, try StoredValue.sequence(through, "released ordinal"))
            try deleteReleasedHeldEvents.run()

        case .rememberMessageID(let remembered):
            try upsertMessageID.bind(1, remembered.sender)
            try upsertMessageID.bind(2, remembered.messageID)
            try upsertMessageID.bind(3, StoredValue.timestamp(remembered.serverTime))
            try upsertMessageID.bind(4, StoredValue.timestamp(remembered.expiresAt))
            try upsertMessageID.run()

        case .forgetMessageID(let sender, let messageID, let serverTime):
            try deleteMessageID.bind(1, sender)
            try deleteMessageID.bind(2, messageID)
            try deleteMessageID.bind(3, StoredValue.timestamp(serverTime))
            try deleteMessageID.run()

        case .registerPush(let user, let device, let registration):
            try upsertPushRegistration.bind(1, user)
            try upsertPushRegistration.bind(2, device)
            try upsertPushRegistration.bind(3, registration.kind.rawValue)
            try upsertPushRegistration.bind(4, registration.platform)
            try upsertPushRegistration.bind(5, registration.token)
            try upsertPushRegistration.bind(6, registration.environment)
            try upsertPushRegistration.bind(7, registration.topic)
            do throws(StoreError) {
                try upsertPushRegistration.run()
            } catch where connection.extendedErrorCode == Self.foreignKeyViolation {
                // Without a device row the registration would be silently lost.
                throw StoreError(.other, "no such device; a device is stored (upsertDevice) before its push registration")
            }

        case .removePush(let user, let device, let kind):
            try deletePushRegistration.bind(1, user)
            try deletePushRegistration.bind(2, device)
            try deletePushRegistration.bind(3, kind.rawValue)
            try deletePushRegistration.run()

        case .withdrawEvent(let user, let device, let seq):
            let seq = try StoredValue.sequence(seq, "withdrawn seq")
            try deleteDeviceEvent.bind(1, user)
            try deleteDeviceEvent.bind(2, device)
            try deleteDeviceEvent.bind(3, seq)
            try deleteDeviceEvent.run()
            raise(user, device, lastSeq: seq)

        case .withdrawHeld(let user, let ordinal):
            try deleteHeldEvent.bind(1, user)
            try deleteHeldEvent.bind(2, try StoredValue.sequence(ordinal, "withdrawn ordinal"))
            try deleteHeldEvent.run()
        }
    }

    /// Binds type, body, the three receipt columns and created_at, in that order.
    private func bindEventFields(of event: StoredEvent, to statement: SQLiteStatement, from first: Int32) throws(StoreError) {
        try statement.bind(first, Int64(event.type))
        try statement.bind(first + 1, event.body)
        try statement.bind(first + 2, event.receipt?.sender)
        try statement.bind(first + 3, event.receipt?.messageID)
        try statement.bind(first + 4, event.receipt?.recipient)
        try statement.bind(first + 5, StoredValue.timestamp(event.createdAt))
    }
}
