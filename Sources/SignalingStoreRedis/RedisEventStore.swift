import SignalingStore
import SignalingSupport

/// An `EventStore` in Redis (docs/STORAGE.md, "Redis"): per-user keys under one Redis
/// Cluster hash tag each (`RedisLayout`), every batch applied by one Lua script, all or
/// nothing (`RedisBatch`), through one hiredis connection per instance.
///
/// Several instances (`configuration.endpoints`, docs/STORAGE.md "Several Redis
/// instances"): each user's keys live on one instance (`RedisShards`); a batch is split
/// by instance and each part runs the same script on its instance, all parts in flight
/// together. `apply` returns only when every part is confirmed, so the store writer's
/// "committed" (OK sent, events released) means committed on every instance. Message-id
/// changes go in a second round, after every other part is confirmed: a remembered id
/// then always means the message's events are stored (a resend that the id de-duplicates
/// is never one whose events were lost). Fencing: the first instance holds the lease,
/// the others a fence this store sets when it opens with a token (`RedisFence`).
///
/// Failures: any I/O error or timeout drops that instance's connection and fails the call
/// with `.io`; the next call connects again, and after a failed connect waits with
/// back-off (calls meanwhile fail at once), so a Redis that is down costs the writer
/// nothing but its retries. The server refuses new messages while `apply` fails
/// (storeUnavailable) and retries the batch, which the script applies idempotently (the
/// parts that were confirmed the first time are applied again, harmlessly). Every
/// connection checks the AOF settings and the layout version again.
///
/// Confinement: like every `EventStore`, used by one thread at a time (`loadSnapshot`
/// before the server starts, then `apply` and `bodies` from the store writer only); that
/// rule, not a lock, makes `@unchecked Sendable` sound.
public final class RedisEventStore: EventStore, EventBodySource, @unchecked Sendable {
    public let configuration: RedisStoreConfiguration
    private let logger: Logger
    private let clock = SystemClock()
    /// One per endpoint, in the configuration's order (index = `RedisShards` instance).
    private let instances: [Instance]
    private var closed = false
    /// SHA1 of `RedisBatch.script`, as SCRIPT LOAD returned it (the same on every instance).
    private var scriptSHA = ""
    /// This store's fencing term (`RedisFence`) when it is sharded and fenced: an instance
    /// it connects to again is fenced again with it (Redis may have lost the fence).
    private var fenceTerm: Int64?

    /// One Redis instance: its connection and reconnect back-off.
    private final class Instance {
        let index: Int
        let endpoint: RedisEndpoint
        /// What the apply script checks the fencing token against here.
        let fenceKey: String
        var connection: RedisConnection?
        /// Failed connects since the last connection; the next attempt waits until `nextConnect`.
        var connectFailures = 0
        var nextConnect: Instant?

        init(index: Int, endpoint: RedisEndpoint) {
            self.index = index
            self.endpoint = endpoint
            fenceKey = index == 0 ? RedisLayout.leaseKey : RedisLayout.fenceKey
        }
    }

    /// Connects to every instance, checks Redis's AOF settings against
    /// `configuration.requiredFsync`, and checks (or, in an empty database, writes) the
    /// layout version and the instance's place in the list. With a fencing token and
    /// several instances, then fences every instance but the first (`RedisFence`), before
    /// anything can be read. Throws `.io` when an instance cannot be reached, `.corrupt`
    /// for a database that is not ours or newer, and `.other` for an AOF weaker than
    /// required, a refused password, a list of instances that does not match the data, or
    /// a lease this node no longer holds.
    public init(configuration: RedisStoreConfiguration, logger: Logger = .silent) throws(StoreError) {
        self.configuration = configuration
        self.logger = logger
        instances = configuration.endpoints.enumerated().map { Instance(index: $0.offset, endpoint: $0.element) }
        for instance in instances {
            let (connection, durability, found) = try connect(instance, firstConnection: true)
            instance.connection = connection
            logger.info("store_opened", [
                "store": "redis", "url": instance.endpoint.redacted, "instance": "\(instance.index)/\(instances.count)",
                "appendonly": durability?.appendOnly ?? "unknown", "appendfsync": durability?.appendFsync ?? "unknown",
                "required_fsync": configuration.requiredFsync.rawValue,
                "schema": found == .created ? "created v\(RedisLayout.schemaVersion)" : "v\(RedisLayout.schemaVersion)",
            ])
        }
        if let token = configuration.fencingToken, instances.count > 1 {
            let term = try withConnection(instances[0]) { connection throws(StoreError) in try RedisFence.takeTerm(connection, token: token) }
            fenceTerm = term
            for instance in instances.dropFirst() {
                try withConnection(instance) { connection throws(StoreError) in try RedisFence.fence(connection, token: token, term: term) }
            }
            logger.info("store_fenced", ["instances": instances.count - 1, "term": term])
        }
    }

    deinit {
        for instance in instances { instance.connection = nil }
    }

    /// The instance that holds `user`'s keys.
    private func instance(ofUser user: String) -> Instance {
        instances[RedisShards.instance(ofUser: user, count: instances.count)]
    }

    // MARK: EventStore

    public func loadSnapshot() throws(StoreError) -> StoredSnapshot {
        var snapshot = StoredSnapshot()
        for instance in instances {
            try withConnection(instance) { connection throws(StoreError) in
                try RedisSnapshotReader(connection: connection).read(into: &snapshot, instance: instance.index, of: instances.count)
            }
        }
        snapshot.sort()
        return snapshot
    }

    public func apply(_ changes: [StoreChange]) throws(StoreError) {
        guard !changes.isEmpty else { return }
        // Encoded before any I/O: a change the store refuses fails the batch here.
        let rounds = try Self.split(changes, instances: instances.count).map { round throws(StoreError) in
            try round.map { part throws(StoreError) in
                (instances[part.instance],
                 try RedisBatch(part.changes, scriptSHA: scriptSHA, fencingToken: configuration.fencingToken,
                                fenceKey: instances[part.instance].fenceKey, positions: part.positions, batchCount: changes.count))
            }
        }
        var skipped: Int64 = 0
        for round in rounds { skipped += try run(round) }
        if skipped > 0 {
            // The reference model skips them too; the SQLite store would refuse the batch.
            // Normal only when a batch is applied a second time after a lost reply.
            logger.warning("store_changes_skipped", ["changes": skipped, "batch": changes.count,
                "detail": "changes for devices the store does not have were skipped"])
        }
    }

    /// A batch's parts, by instance, in rounds: each round's parts run together, a round
    /// only after every part of the one before is confirmed. One instance: one round with
    /// the whole batch (atomic, as unsharded). Several: message-id changes (the sender's
    /// `rememberMessageID` / `forgetMessageID`) in a second round, so that a message's
    /// id is never stored without its events. Each part keeps the batch's order.
    static func split(_ changes: [StoreChange], instances count: Int) -> [[Part]] {
        var places = [Int](repeating: 0, count: changes.count)
        var touched = Set<Int>()
        var owners: [String: Int] = [:]  // the hash of each user once per batch
        for (index, change) in changes.enumerated() {
            let owner = change.owner
            let place: Int
            if let known = owners[owner] { place = known } else {
                place = RedisShards.instance(ofUser: owner, count: count)
                owners[owner] = place
            }
            places[index] = place
            touched.insert(place)
        }
        if touched.count == 1 { return [[Part(instance: places[0], changes: changes, positions: Array(changes.indices))]] }
        var first = (0..<count).map { Part(instance: $0, changes: [], positions: []) }
        var ids = first
        for (index, change) in changes.enumerated() {
            let place = places[index]
            switch change {
            case .rememberMessageID, .forgetMessageID:
                ids[place].changes.append(change)
                ids[place].positions.append(index)
            default:
                first[place].changes.append(change)
                first[place].positions.append(index)
            }
        }
        return [first, ids].map { $0.filter { !$0.changes.isEmpty } }.filter { !$0.isEmpty }
    }

    /// One instance's share of a batch: its changes, and where each stood in the batch.
    struct Part {
        var instance: Int
        var changes: [StoreChange]
        var positions: [Int]
    }

    /// Runs one round: every part sent before any reply is read (one round trip for all,
    /// not one per instance), then every reply read, so no connection is left with a reply
    /// unread. Returns the changes skipped; throws the first failure, after all replies.
    private func run(_ round: [(Instance, RedisBatch)]) throws(StoreError) -> Int64 {
        var sent: [(Instance, RedisBatch, RedisConnection)] = []
        var failure: StoreError?
        for (instance, batch) in round {
            do throws(StoreError) {
                let connection = try connected(instance)
                try connection.send([batch.command])
                sent.append((instance, batch, connection))
            } catch {
                dropped(instance, error)
                failure = failure ?? error
            }
        }
        var skipped: Int64 = 0
        for (instance, batch, connection) in sent {
            do throws(StoreError) {
                var reply = try connection.receive(1)[0]
                if case .error(let message) = reply, message.hasPrefix("NOSCRIPT") {
                    // Redis restarted (or SCRIPT FLUSH) since this connection loaded it.
                    try loadScript(connection)
                    reply = try connection.run(batch.command)
                }
                switch reply {
                case .integer(let count): skipped += count
                case .error(let message): throw Self.error(fromReply: message, address: instance.endpoint.address)
                default: throw StoreError(.other, "the apply script answered \(reply)")
                }
            } catch {
                dropped(instance, error)
                failure = failure ?? error
            }
        }
        if let failure { throw failure }
        return skipped
    }

    public func close() {
        closed = true
        for instance in instances { instance.connection = nil }
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
        let holder = instance(ofUser: user)
        let reply = try withConnection(holder) { connection throws(StoreError) in try connection.run(command) }
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
        case .error(let message): throw Self.error(fromReply: message, address: holder.endpoint.address)
        default: throw StoreError(.other, "ZRANGEBYLEX answered \(reply)")
        }
    }

    // MARK: Connection

    /// Runs `body` on the instance's connection, connecting first if there is none. An I/O
    /// failure drops the connection (the next call connects again).
    private func withConnection<T>(_ instance: Instance, _ body: (RedisConnection) throws(StoreError) -> T) throws(StoreError) -> T {
        let connection = try connected(instance)
        do throws(StoreError) {
            return try body(connection)
        } catch {
            dropped(instance, error)
            throw error
        }
    }

    /// After a failure on the instance's connection: an I/O error makes it unusable.
    private func dropped(_ instance: Instance, _ error: StoreError) {
        guard error.kind == .io, instance.connection != nil else { return }
        instance.connection = nil
        logger.warning("store_disconnected", ["address": instance.endpoint.address, "error": error.message])
    }

    private func connected(_ instance: Instance) throws(StoreError) -> RedisConnection {
        guard !closed else { throw StoreError(.other, "the store is closed") }
        if let connection = instance.connection { return connection }
        let now = clock.now()
        if let nextConnect = instance.nextConnect, now < nextConnect {
            throw StoreError(.io, "Redis at \(instance.endpoint.address) is unreachable; "
                + "next attempt in \((nextConnect - now).milliseconds) ms")
        }
        do throws(StoreError) {
            let (connection, _, _) = try connect(instance, firstConnection: false)
            instance.connection = connection
            if instance.connectFailures > 0 {
                logger.info("store_reconnected", ["address": instance.endpoint.address, "failed_attempts": instance.connectFailures])
            }
            instance.connectFailures = 0
            instance.nextConnect = nil
            return connection
        } catch {
            let delay = min(configuration.longestReconnectDelayMilliseconds,
                            configuration.firstReconnectDelayMilliseconds << min(instance.connectFailures, 16))
            instance.connectFailures += 1
            instance.nextConnect = clock.now() + .milliseconds(delay)
            throw error
        }
    }

    /// A new connection, checked: AOF settings, layout version and place, the script
    /// loaded, and (connecting again to a fenced instance) the fence set again.
    private func connect(_ instance: Instance, firstConnection: Bool) throws(StoreError)
        -> (RedisConnection, RedisSchema.Durability?, RedisSchema.Found)
    {
        let connection = try RedisConnection(endpoint: instance.endpoint, timeoutMilliseconds: configuration.timeoutMilliseconds)
        let durability = try RedisSchema.checkDurability(connection, configuration, logger: logger)
        let found = try RedisSchema.prepare(connection, firstConnection: firstConnection, instance: instance.index, of: instances.count)
        try loadScript(connection)
        if let term = fenceTerm, let token = configuration.fencingToken, instance.index > 0 {
            // Redis may have come back without the fence (an AOF with fsync everysec loses
            // its last second): set again, it keeps a deposed holder out; refused, this
            // node was deposed itself.
            try RedisFence.fence(connection, token: token, term: term)
        }
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
