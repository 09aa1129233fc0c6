import SignalingStore
import SignalingSupport

/// An `EventStore` in Redis (docs/STORAGE.md, "Redis"): per-user keys under one Redis
/// Cluster hash tag each (`RedisLayout`), every batch applied by one Lua script, all or
/// nothing (`RedisBatch`), through one hiredis connection.
///
/// Failures: any I/O error or timeout drops the connection and fails the call with `.io`;
/// the next call connects again, and after a failed connect waits with back-off (calls
/// meanwhile fail at once), so a Redis that is down costs the writer nothing but its
/// retries. The server refuses new messages while `apply` fails (storeUnavailable) and
/// retries the batch, which the script applies idempotently. Every connection checks the
/// AOF settings and the layout version again.
///
/// Confinement: like every `EventStore`, used by one thread at a time (`loadSnapshot`
/// before the server starts, then `apply` and `bodies` from the store writer only); that
/// rule, not a lock, makes `@unchecked Sendable` sound.
public final class RedisEventStore: EventStore, EventBodySource, @unchecked Sendable {
    public let configuration: RedisStoreConfiguration
    private let logger: Logger
    private let clock = SystemClock()
    private var connection: RedisConnection?
    private var closed = false
    /// Failed connects since the last connection; the next attempt waits until `nextConnect`.
    private var connectFailures = 0
    private var nextConnect: Instant?
    /// SHA1 of `RedisBatch.script`, as SCRIPT LOAD returned it.
    private var scriptSHA = ""

    /// Connects, checks Redis's AOF settings against `configuration.requiredFsync`, and
    /// checks (or, in an empty database, writes) the layout version. Throws `.io` when
    /// Redis cannot be reached, `.corrupt` for a database that is not ours or newer, and
    /// `.other` for an AOF weaker than required or a refused password.
    public init(configuration: RedisStoreConfiguration, logger: Logger = .silent) throws(StoreError) {
        self.configuration = configuration
        self.logger = logger
        let (connection, durability, found) = try connect(firstConnection: true)
        self.connection = connection
        logger.info("store_opened", [
            "store": "redis", "url": configuration.endpoint.redacted,
            "appendonly": durability?.appendOnly ?? "unknown", "appendfsync": durability?.appendFsync ?? "unknown",
            "required_fsync": configuration.requiredFsync.rawValue,
            "schema": found == .created ? "created v\(RedisLayout.schemaVersion)" : "v\(RedisLayout.schemaVersion)",
        ])
    }

    deinit {
        connection = nil
    }

    // MARK: EventStore

    public func loadSnapshot() throws(StoreError) -> StoredSnapshot {
        try withConnection { connection throws(StoreError) in try RedisSnapshotReader(connection: connection).read() }
    }

    public func apply(_ changes: [StoreChange]) throws(StoreError) {
        guard !changes.isEmpty else { return }
        // Encoded before any I/O: a change the store refuses fails the batch here.
        let batch = try RedisBatch(changes, scriptSHA: scriptSHA, fencingToken: configuration.fencingToken)
        let skipped = try withConnection { connection throws(StoreError) -> Int64 in
            var reply = try connection.run(batch.command)
            if case .error(let message) = reply, message.hasPrefix("NOSCRIPT") {
                // Redis restarted (or SCRIPT FLUSH) since this connection loaded it.
                try loadScript(connection)
                reply = try connection.run(batch.command)
            }
            switch reply {
            case .integer(let skipped): return skipped
            case .error(let message):
                throw Self.error(fromReply: message, address: connection.endpoint.address)
            default:
                throw StoreError(.other, "the apply script answered \(reply)")
            }
        }
        if skipped > 0 {
            // The reference model skips them too; the SQLite store would refuse the batch.
            // Normal only when a batch is applied a second time after a lost reply.
            logger.warning("store_changes_skipped", ["changes": skipped, "batch": changes.count,
                "detail": "changes for devices the store does not have were skipped"])
        }
    }

    public func close() {
        closed = true
        connection = nil
    }

    // MARK: EventBodySource

    public func bodies(user: String, device: String, from seq: UInt64, limit: Int) throws(StoreError) -> [(seq: UInt64, body: [UInt8])] {
        let key = RedisLayout.queueKey(user, device)
        var command = RedisCommand("ZRANGEBYLEX")
        command.append(key)
        command.append([UInt8(ascii: "[")] + RedisLayout.digits(seq))
        command.append("+")
        command.append("LIMIT")
        command.append("0")
        command.append(String(max(0, limit)))
        let reply = try withConnection { connection throws(StoreError) in try connection.run(command) }
        let name = String(decoding: key, as: UTF8.self)
        switch reply {
        case .array(let members):
            var bodies: [(seq: UInt64, body: [UInt8])] = []
            bodies.reserveCapacity(members.count)
            for member in members {
                guard case .string(let bytes) = member else { throw StoreError(.corrupt, "\(name) holds a member that is not a string") }
                bodies.append(try EventRecord.seqAndBody(bytes, in: name))
            }
            return bodies
        case .error(let message): throw Self.error(fromReply: message, address: configuration.endpoint.address)
        default: throw StoreError(.other, "ZRANGEBYLEX answered \(reply)")
        }
    }

    // MARK: Connection

    /// Runs `body` on the connection, connecting first if there is none. An I/O failure
    /// drops the connection (the next call connects again).
    private func withConnection<T>(_ body: (RedisConnection) throws(StoreError) -> T) throws(StoreError) -> T {
        guard !closed else { throw StoreError(.other, "the store is closed") }
        let connection = try connected()
        do throws(StoreError) {
            return try body(connection)
        } catch {
            if error.kind == .io {
                self.connection = nil
                logger.warning("store_disconnected", ["address": configuration.endpoint.address, "error": error.message])
            }
            throw error
        }
    }

    private func connected() throws(StoreError) -> RedisConnection {
        if let connection { return connection }
        let now = clock.now()
        if let nextConnect, now < nextConnect {
            throw StoreError(.io, "Redis at \(configuration.endpoint.address) is unreachable; "
                + "next attempt in \((nextConnect - now).milliseconds) ms")
        }
        do throws(StoreError) {
            let (connection, _, _) = try connect(firstConnection: false)
            self.connection = connection
            if connectFailures > 0 {
                logger.info("store_reconnected", ["address": configuration.endpoint.address, "failed_attempts": connectFailures])
            }
            connectFailures = 0
            nextConnect = nil
            return connection
        } catch {
            let delay = min(configuration.longestReconnectDelayMilliseconds,
                            configuration.firstReconnectDelayMilliseconds << min(connectFailures, 16))
            connectFailures += 1
            nextConnect = clock.now() + .milliseconds(delay)
            throw error
        }
    }

    /// A new connection, checked: AOF settings, layout version, the script loaded.
    private func connect(firstConnection: Bool) throws(StoreError)
        -> (RedisConnection, RedisSchema.Durability?, RedisSchema.Found)
    {
        let connection = try RedisConnection(endpoint: configuration.endpoint, timeoutMilliseconds: configuration.timeoutMilliseconds)
        let durability = try RedisSchema.checkDurability(connection, configuration, logger: logger)
        let found = try RedisSchema.prepare(connection, firstConnection: firstConnection)
        try loadScript(connection)
        return (connection, durability, found)
    }

    private func loadScript(_ connection: RedisConnection) throws(StoreError) {
        switch try connection.run(RedisCommand("SCRIPT", "LOAD", RedisBatch.script)) {
        case .string(let sha): scriptSHA = String(decoding: sha, as: UTF8.self)
        case .error(let message): throw Self.error(fromReply: message, address: connection.endpoint.address)
        case let other: throw StoreError(.other, "SCRIPT LOAD answered \(other)")
        }
    }

    /// A Redis error reply as a `StoreError` of the kind the server acts on.
    static func error(fromReply message: String, address: String) -> StoreError {
        let code = message.prefix { $0 != " " }
        let kind: StoreError.Kind
        switch code {
        case "OOM": kind = .full  // maxmemory reached; acknowledgements and expiry free memory
        case "READONLY": kind = .readOnly  // a replica
        case "VSCORRUPT", "WRONGTYPE": kind = .corrupt  // a key another program wrote
        // Fenced: another node holds the lease (or it lapsed). Not transient for this
        // node: its lease thread steps it down; retrying is harmless, Redis refuses again.
        case "VSFENCED": kind = .other
        // Transient: Redis is loading its AOF, busy with a script, cannot persist, failing over.
        case "LOADING", "BUSY", "MISCONF", "TRYAGAIN", "MASTERDOWN", "CLUSTERDOWN": kind = .io
        default: kind = .other
        }
        return StoreError(kind, "Redis at \(address): \(message)")
    }
}
