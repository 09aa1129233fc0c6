import SQLiteStoreFixtures
import Foundation
import SignalingStore
import SignalingStoreSQLite
import TestSupport
import Testing

/// What the store finds on disk: nothing, its own file, someone else's, a newer one.
@Suite("SQLite store: the database file")
struct DatabaseFileTests {
    private func configuration(_ directory: TemporaryDirectory) -> SQLiteStoreConfiguration {
        SQLiteStoreConfiguration(directory: directory.file("data"))
    }

    /// Makes `data/voipserver.sqlite` with the given contents, before the store opens it.
    private func place(_ contents: [UInt8], in directory: TemporaryDirectory) throws -> String {
        let path = configuration(directory).databasePath
        try FileManager.default.createDirectory(atPath: directory.file("data"), withIntermediateDirectories: true)
        #expect(FileManager.default.createFile(atPath: path, contents: Data(contents)))
        return path
    }

    @Test("a new store creates its directory, with parents, and a WAL-mode file with schema version 4")
    func createsEverything() throws {
        let directory = try TemporaryDirectory()
        let configuration = SQLiteStoreConfiguration(directory: directory.file("a/b/data"))
        let store = try SQLiteEventStore(configuration: configuration)
        try store.apply([Sample.device("alice", "phone")])
        let database = try RawDatabase(path: configuration.databasePath)
        #expect(try database.text("PRAGMA journal_mode") == "wal")
        #expect(try database.text("PRAGMA user_version") == "4")
        #expect(try database.text("SELECT count(*) FROM devices") == "1")
        store.close()
        let mode = try FileManager.default.attributesOfItem(atPath: configuration.databasePath)[.posixPermissions] as? Int
        #expect(mode == 0o600)
    }

    @Test("a file that is not an SQLite database is refused as corrupt")
    func notSQLite() throws {
        let directory = try TemporaryDirectory()
        let path = try place(Array("these are not the pages you are looking for\n".utf8) + [UInt8](repeating: 7, count: 8_192), in: directory)
        let error = #expect(throws: StoreError.self) { try SQLiteEventStore(configuration: configuration(directory)) }
        #expect(error?.kind == .corrupt)
        #expect(error?.message.contains(path) == true, "\(String(describing: error))")
    }

    @Test("another application's SQLite database is refused as corrupt, and left untouched")
    func someoneElsesDatabase() throws {
        let directory = try TemporaryDirectory()
        let path = try place([], in: directory)
        try RawDatabase(path: path).execute("CREATE TABLE recipes (name TEXT); INSERT INTO recipes VALUES ('soup')")
        let error = #expect(throws: StoreError.self) { try SQLiteEventStore(configuration: configuration(directory)) }
        #expect(error?.kind == .corrupt)
        #expect(error?.message.contains("not a voipserver store") == true, "\(String(describing: error))")
        let database = try RawDatabase(path: path)
        #expect(try database.text("SELECT name FROM recipes") == "soup")
        #expect(try database.text("SELECT count(*) FROM sqlite_master WHERE name = 'devices'") == "0")
    }

    @Test("a version 1 file is upgraded: its one push registration per device moves to push_registrations, by kind, and its message ids stay")
    func upgradesVersion1() throws {
        let directory = try TemporaryDirectory()
        let configuration = configuration(directory)
        let path = try place([], in: directory)
        // Version 1 exactly as it was created (SQLiteSchema.version1), with two devices.
        let raw = try RawDatabase(path: path)
        try raw.execute("""
            CREATE TABLE devices (user_id TEXT NOT NULL, device_id TEXT NOT NULL,
                session_id BLOB NOT NULL CHECK (length(session_id) = 16), acked_seq INTEGER NOT NULL,
                last_seq INTEGER NOT NULL, last_seen INTEGER NOT NULL, push_platform TEXT, push_token BLOB,
                CHECK ((push_platform IS NULL) = (push_token IS NULL)), PRIMARY KEY (user_id, device_id)) WITHOUT ROWID;
            CREATE TABLE device_events (user_id TEXT NOT NULL, device_id TEXT NOT NULL, seq INTEGER NOT NULL,
                type INTEGER NOT NULL, body BLOB NOT NULL, receipt_sender TEXT, receipt_message_id TEXT,
                receipt_recipient TEXT, created_at INTEGER NOT NULL, PRIMARY KEY (user_id, device_id, seq),
                FOREIGN KEY (user_id, device_id) REFERENCES devices (user_id, device_id));
            CREATE TABLE held_events (user_id TEXT NOT NULL, ordinal INTEGER NOT NULL, type INTEGER NOT NULL,
                body BLOB NOT NULL, receipt_sender TEXT, receipt_message_id TEXT, receipt_recipient TEXT,
                created_at INTEGER NOT NULL, PRIMARY KEY (user_id, ordinal));
            CREATE TABLE message_ids (sender_id TEXT NOT NULL, message_id TEXT NOT NULL, server_time INTEGER NOT NULL,
                expires_at INTEGER NOT NULL, PRIMARY KEY (sender_id, message_id)) WITHOUT ROWID;
            INSERT INTO devices VALUES ('alice', 'phone', zeroblob(16), 0, 3, 10, 'apns', x'0102');
            INSERT INTO devices VALUES ('bob', 'pixel', zeroblob(16), 0, 0, 10, 'my-gateway', x'09');
            INSERT INTO devices VALUES ('carol', 'pc', zeroblob(16), 0, 0, 10, NULL, NULL);
            INSERT INTO message_ids VALUES ('bob', 'm2', 20, 120), ('bob', 'm1', 30, 130), ('amy', 'm9', 10, 110);
            PRAGMA application_id = 1448298823; PRAGMA user_version = 1;
            """)
        let store = try SQLiteEventStore(configuration: configuration)
        let snapshot = try store.loadSnapshot()
        store.close()
        let byUser = Dictionary(uniqueKeysWithValues: snapshot.devices.map { ($0.userID, $0) })
        #expect(byUser["alice"]?.pushRegistrations == [PushRegistration(platform: "apns", token: [1, 2])])
        #expect(byUser["alice"]?.lastSeq == 3)
        #expect(byUser["bob"]?.pushRegistrations.map(\.kind) == [.webhook])
        #expect(byUser["bob"]?.pushRegistrations.first?.platform == "my-gateway")
        #expect(byUser["carol"]?.pushRegistrations == [])
        #expect(snapshot.messageIDs == [
            StoredMessageID(sender: "amy", messageID: "m9", serverTime: 10, expiresAt: 110),
            StoredMessageID(sender: "bob", messageID: "m1", serverTime: 30, expiresAt: 130),
            StoredMessageID(sender: "bob", messageID: "m2", serverTime: 20, expiresAt: 120),
        ])
        let database = try RawDatabase(path: path)
        #expect(try database.text("PRAGMA user_version") == "4")
        #expect(try database.text("SELECT count(*) FROM devices WHERE push_platform IS NOT NULL") == "0")
    }

    @Test("a version 3 file is upgraded: of an id's superseded records only the latest stays, other ids untouched")
    func upgradesVersion3() throws {
        let directory = try TemporaryDirectory()
        let configuration = configuration(directory)
        try SQLiteEventStore(configuration: configuration).close()
        // As a version 3 server left it: bob's m1 expired while the server was down and was
        // sent again twice (three records), before the start-up sweep existed.
        let raw = try RawDatabase(path: configuration.databasePath)
        try raw.execute("""
            INSERT INTO message_ids (server_time, sender_id, message_id, expires_at) VALUES
                (10, 'bob', 'm1', 110), (30, 'bob', 'm1', 130), (20, 'bob', 'm1', 120),
                (15, 'amy', 'm1', 115), (25, 'bob', 'm2', 125);
            PRAGMA user_version = 3;
            """)
        let store = try SQLiteEventStore(configuration: configuration)
        let snapshot = try store.loadSnapshot()
        store.close()
        #expect(snapshot.messageIDs == [
            StoredMessageID(sender: "amy", messageID: "m1", serverTime: 15, expiresAt: 115),
            StoredMessageID(sender: "bob", messageID: "m1", serverTime: 30, expiresAt: 130),
            StoredMessageID(sender: "bob", messageID: "m2", serverTime: 25, expiresAt: 125),
        ])
        let database = try RawDatabase(path: configuration.databasePath)
        #expect(try database.text("PRAGMA user_version") == "4")
        #expect(try database.text("SELECT group_concat(server_time) FROM (SELECT server_time FROM message_ids ORDER BY server_time)") == "15,25,30")
    }

    @Test("a store written by a newer schema version is refused as corrupt, naming both versions")
    func newerSchema() throws {
        let directory = try TemporaryDirectory()
        let configuration = configuration(directory)
        try SQLiteEventStore(configuration: configuration).close()
        try RawDatabase(path: configuration.databasePath).execute("PRAGMA user_version = 7")
        let error = #expect(throws: StoreError.self) { try SQLiteEventStore(configuration: configuration) }
        #expect(error?.kind == .corrupt)
        #expect(error?.message.contains("newer") == true && error?.message.contains("version 7") == true,
                "\(String(describing: error))")
    }

    @Test("a second store on the same directory is refused while the first is open")
    func oneOwnerAtATime() throws {
        let directory = try TemporaryDirectory()
        let first = try SQLiteEventStore(configuration: configuration(directory))
        let error = #expect(throws: StoreError.self) { try SQLiteEventStore(configuration: configuration(directory)) }
        #expect(error?.message.contains("in use") == true, "\(String(describing: error))")
        try first.apply([Sample.device("alice", "phone")])
        first.close()
        let second = try SQLiteEventStore(configuration: configuration(directory))
        #expect(try second.loadSnapshot().devices.count == 1)
    }

    @Test("a data directory path that is a regular file is a clear error")
    func directoryIsAFile() throws {
        let directory = try TemporaryDirectory()
        #expect(FileManager.default.createFile(atPath: directory.file("data"), contents: Data()))
        let error = #expect(throws: StoreError.self) { try SQLiteEventStore(configuration: configuration(directory)) }
        #expect(error?.message.contains("not a directory") == true, "\(String(describing: error))")
    }

    @Test("settings SQLite would misread are refused before anything is created")
    func invalidSettings() throws {
        let directory = try TemporaryDirectory()
        for configuration in [
            SQLiteStoreConfiguration(directory: directory.file("data"), maxPageCount: 0),
            SQLiteStoreConfiguration(directory: directory.file("data"), busyTimeoutMilliseconds: -1),
            SQLiteStoreConfiguration(directory: ""),
        ] {
            #expect(throws: StoreError.self) { try SQLiteEventStore(configuration: configuration) }
        }
        #expect(!FileManager.default.fileExists(atPath: directory.file("data")))
    }
}
