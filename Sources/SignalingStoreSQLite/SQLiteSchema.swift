import SignalingStore

/// The tables, and how a database file is recognised, created and upgraded.
///
/// Integers are SQLite's signed 64-bit. Sequence numbers and ordinals are at most 2^63 - 1
/// (the store refuses larger ones). Timestamps (ms since the Unix epoch) are stored as
/// their bit pattern, so every `UInt64` round-trips; values from 2^63 up read back
/// correctly but show as negative in the sqlite3 shell.
///
/// `devices.acked_seq` is no longer written or read (a device's acknowledged numbers follow
/// from its stored events: `StoredDevice.ackedSeq`); it keeps whatever an older version
/// wrote, which an older version reading the file may still use: it is never above the
/// truth, which is all that version needed of it.
enum SQLiteSchema {
    /// `PRAGMA application_id`: "VSIG" in ASCII, the protocol's HELLO magic. Tells our
    /// file from any other SQLite database.
    static let applicationID: Int64 = 0x5653_4947

    /// `PRAGMA user_version`: the schema this build writes. Raise it with a new entry in
    /// `upgrades` whenever the tables change.
    static let currentVersion: Int64 = 4

    /// Version 1, created in an empty file.
    static let version1: [String] = [
        """
        CREATE TABLE devices (
            user_id       TEXT    NOT NULL,
            device_id     TEXT    NOT NULL,
            session_id    BLOB    NOT NULL CHECK (length(session_id) = 16), -- big-endian high, low
            acked_seq     INTEGER NOT NULL,            -- every event <= this was acknowledged
            last_seq      INTEGER NOT NULL,            -- highest sequence number assigned
            last_seen     INTEGER NOT NULL,            -- ms since the Unix epoch
            push_platform TEXT,                        -- version 1 only; NULL from version 2
            push_token    BLOB,                      -- (push_registrations holds them)
            CHECK ((push_platform IS NULL) = (push_token IS NULL)),
            PRIMARY KEY (user_id, device_id)
        ) WITHOUT ROWID
        """,
        // A device's unacknowledged events. Rowid table: bodies (up to 64 KiB) are too
        // large to live in a WITHOUT ROWID b-tree. The primary key's index serves the
        // snapshot's ordered scan and the acknowledgement's range delete.
        """
        CREATE TABLE device_events (
            user_id            TEXT    NOT NULL,
            device_id          TEXT    NOT NULL,
            seq                INTEGER NOT NULL,
            type               INTEGER NOT NULL,   -- FrameType raw value
            body               BLOB    NOT NULL,   -- the event as encoded after its seq
            receipt_sender     TEXT,               -- MESSAGE events: whom to tell on ACK
            receipt_message_id TEXT,
            receipt_recipient  TEXT,
            created_at         INTEGER NOT NULL,   -- ms since the Unix epoch
            CHECK ((receipt_sender IS NULL) = (receipt_message_id IS NULL)
                   AND (receipt_sender IS NULL) = (receipt_recipient IS NULL)),
            PRIMARY KEY (user_id, device_id, seq),
            FOREIGN KEY (user_id, device_id) REFERENCES devices (user_id, device_id)
        )
        """,
        // Events for users none of whose devices the server knows, in arrival order.
        """
        CREATE TABLE held_events (
            user_id            TEXT    NOT NULL,
            ordinal            INTEGER NOT NULL,
            type               INTEGER NOT NULL,
            body               BLOB    NOT NULL,
            receipt_sender     TEXT,
            receipt_message_id TEXT,
            receipt_recipient  TEXT,
            created_at         INTEGER NOT NULL,
            CHECK ((receipt_sender IS NULL) = (receipt_message_id IS NULL)
                   AND (receipt_sender IS NULL) = (receipt_recipient IS NULL)),
            PRIMARY KEY (user_id, ordinal)
        )
        """,
        // Recently accepted message ids, for de-duplicating re-sent messages (re-keyed by
        // version 3).
        """
        CREATE TABLE message_ids (
            sender_id   TEXT    NOT NULL,
            message_id  TEXT    NOT NULL,
            server_time INTEGER NOT NULL,   -- returned again for a duplicate
            expires_at  INTEGER NOT NULL,
            PRIMARY KEY (sender_id, message_id)
        ) WITHOUT ROWID
        """,
    ]

    /// Upgrades from each older version to the next, run in order inside one transaction.
    /// A new file gets `version1` and then every upgrade, so there is one path to each
    /// version.
    static let upgrades: [Int64: [String]] = [
        // Version 2: several push registrations per device, one per kind of token (issue
        // 17: a VoIP and an alert token on one iPhone). The kind is derived from the
        // platform name as `PushTokenKind(platform:)` does. The old columns stay (SQLite
        // cannot drop a column a CHECK names) but are emptied and no longer read.
        1: [
            """
            CREATE TABLE push_registrations (
                user_id     TEXT NOT NULL,
                device_id   TEXT NOT NULL,
                kind        TEXT NOT NULL,           -- apns-voip, apns, fcm or webhook
                platform    TEXT NOT NULL,           -- as the device named it
                token       BLOB NOT NULL,
                environment TEXT NOT NULL DEFAULT '', -- APNs: sandbox or production ('')
                topic       TEXT NOT NULL DEFAULT '', -- APNs: bundle id ('' = configured)
                PRIMARY KEY (user_id, device_id, kind),
                FOREIGN KEY (user_id, device_id) REFERENCES devices (user_id, device_id)
            ) WITHOUT ROWID
            """,
            """
            INSERT INTO push_registrations (user_id, device_id, kind, platform, token)
            SELECT user_id, device_id,
                   CASE WHEN push_platform IN ('apns-voip', 'apns', 'fcm') THEN push_platform ELSE 'webhook' END,
                   push_platform, push_token
            FROM devices WHERE push_platform IS NOT NULL
            """,
            "UPDATE devices SET push_platform = NULL, push_token = NULL WHERE push_platform IS NOT NULL",
        ],
        // Version 3: message ids keyed by server time first (issue 16). Apps' ids are
        // random (UUIDs): keyed by (sender, id), every remembered id and every forgotten one
        // (the oldest, once --dedup-capacity is reached) landed on a random page of a B-tree
        // of up to a million rows, which cost 4.6 times the writer's CPU and 7.8 times the
        // bytes written per message of ids that arrive in order (Tools/store-bench). Now
        // both touch the ends of the tree. A record is found by its server time
        // (`StoreChange.forgetMessageID`); the snapshot keeps each id's latest record.
        2: [
            """
            CREATE TABLE message_ids_by_time (
                server_time INTEGER NOT NULL,   -- returned again for a duplicate
                sender_id   TEXT    NOT NULL,
                message_id  TEXT    NOT NULL,
                expires_at  INTEGER NOT NULL,
                PRIMARY KEY (server_time, sender_id, message_id)
            ) WITHOUT ROWID
            """,
            """
            INSERT INTO message_ids_by_time (server_time, sender_id, message_id, expires_at)
            SELECT server_time, sender_id, message_id, expires_at FROM message_ids
            """,
            "DROP TABLE message_ids",
            "ALTER TABLE message_ids_by_time RENAME TO message_ids",
        ],
        // Version 4: one record per message id. Keyed by time (version 3), the table could
        // hold two records of one id: until the start-up sweep of expired ids
        // (`ExpiredMessageIDSweep`), an id that expired while the server was down and was
        // then sent again got a second record, and the first, never in a snapshot again
        // (which keeps the latest), was never forgotten. Since the sweep no such record is
        // made; this removes the ones older servers left, the latest of each id staying.
        // Cost, once: a pass over the table sorted by id (a temporary B-tree), then a lookup
        // per row: 2.3 s for a million ids, 10,000 of them twice (sqlite3 shell, the test host).
        3: [
            """
            CREATE TEMP TABLE latest_message_ids (
                sender_id   TEXT    NOT NULL,
                message_id  TEXT    NOT NULL,
                server_time INTEGER NOT NULL,
                PRIMARY KEY (sender_id, message_id)
            ) WITHOUT ROWID
            """,
            """
            INSERT INTO latest_message_ids (sender_id, message_id, server_time)
            SELECT sender_id, message_id, max(server_time) FROM message_ids
            GROUP BY sender_id, message_id HAVING count(*) > 1
            """,
            """
            DELETE FROM message_ids WHERE server_time < (
                SELECT latest.server_time FROM latest_message_ids AS latest
                WHERE latest.sender_id = message_ids.sender_id AND latest.message_id = message_ids.message_id)
            """,
            "DROP TABLE latest_message_ids",
        ],
    ]

    /// Creates the schema in an empty file, upgrades an older one, and refuses a file that
    /// is not ours or is newer than this build. Runs in one write transaction, so a crash
    /// midway leaves the file as it was. Returns the version found before any upgrade
    /// (0 for a new file).
    static func prepare(_ connection: SQLiteConnection) throws(StoreError) -> Int64 {
        try connection.execute("BEGIN IMMEDIATE")
        do throws(StoreError) {
            let found = try check(connection)
            if found == 0 {
                for statement in version1 { try connection.execute(statement) }
                try connection.execute("PRAGMA application_id = \(applicationID)")
            }
            for version in max(found, 1)..<currentVersion {
                for statement in upgrades[version] ?? [] { try connection.execute(statement) }
            }
            if found != currentVersion {
                try connection.execute("PRAGMA user_version = \(currentVersion)")
            }
            try connection.execute("COMMIT")
            return found
        } catch {
            if !connection.isAutocommit { try? connection.execute("ROLLBACK") }
            throw error
        }
    }

    /// The file's schema version, 0 for an empty file; throws `.corrupt` for anything else
    /// we cannot use.
    private static func check(_ connection: SQLiteConnection) throws(StoreError) -> Int64 {
        let application = try connection.integer("PRAGMA application_id")
        let version = try connection.integer("PRAGMA user_version")
        let objects = try connection.integer("SELECT count(*) FROM sqlite_master")
        if application == 0 && version == 0 && objects == 0 { return 0 }
        guard application == applicationID else {
            throw StoreError(.corrupt, "an SQLite database, but not a voipserver store "
                + "(application_id \(application), expected \(applicationID)); refusing to use it. "
                + "Point the server at another data directory.")
        }
        guard version <= currentVersion else {
            throw StoreError(.corrupt, "written by a newer voipserver (schema version \(version); "
                + "this build understands up to \(currentVersion)). Run the newer server, or restore a backup.")
        }
        guard version >= 1 else {
            throw StoreError(.corrupt, "a voipserver store with an unknown schema version \(version)")
        }
        return version
    }
}
