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

    @Test("a new store creates its directory, with parents, and a WAL-mode file with schema version 1")
    func createsEverything() throws {
        let directory = try TemporaryDirectory()
        let configuration = SQLiteStoreConfiguration(directory: directory.file("a/b/data"))
        let store = try SQLiteEventStore(configuration: configuration)
        try store.apply([Sample.device("alice", "phone")])
        let database = try RawDatabase(path: configuration.databasePath)
        #expect(try database.text("PRAGMA journal_mode") == "wal")
        #expect(try database.text("PRAGMA user_version") == "1")
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
