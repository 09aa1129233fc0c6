import SignalingStore
import SignalingSupport

/// Moves a sharded store's users from one list of Redis instances to another
/// (`voipserver store-rebalance`, docs/STORAGE.md "Adding an instance"): each user's keys
/// go to the instance `RedisShards` places the user on with the new list. With jump hash,
/// appending an instance moves only the users that land on it (about 1 in N+1); any other
/// change of the list (reordering, removing) moves whoever it must.
///
/// It runs while no node serves the store, and makes sure of that rather than trusting it:
/// - **Refuses a live store**: a lease held by a node, or a node's presence key, stops it
///   (`force` overrides, for a lease whose node is known to be dead before its TTL ends).
/// - **Fences every instance** before it writes: it holds the lease (without a TTL) on the
///   first instance of both lists, and fences every instance (`RedisFence`) with a term
///   above every term any instance has seen. A node that was missed gets `VSFENCED` on
///   every batch, everywhere; and the next node to take the lease gets a higher term.
/// - **Marks every instance** (`voip:instance` = `rebalance HASH`, the lists' hash), so a
///   node started during the move, or after an interrupted one, refuses to open the store
///   (`RedisSchema.prepare`) instead of reading users from the wrong places.
///
/// One user at a time: DUMP on the source, RESTORE (REPLACE) and SADD to `voip:users` on
/// the target, a check that every key arrived, then one MULTI/EXEC on the source that
/// deletes the keys and the index entry. So at every moment each user's data is whole on
/// the source, or on both (the same bytes), or on the target: an interrupted run loses
/// nothing, and running it again with the same lists finishes it (users already in place
/// are skipped; a user on both is copied again, which REPLACE makes harmless).
///
/// Finally each instance of the new list records its place (`INDEX/COUNT`), an instance
/// dropped from the list records `retired`, and the leases are released. The fences stay:
/// the next node to take the lease fences over them with its higher term.
///
/// Cost: one SCAN of each instance's keys (kept in memory, grouped by user), then three
/// round trips per moved user (DUMP, RESTORE + check, delete). Users that stay cost
/// nothing beyond the scan.
public struct RedisRebalance {
    public struct Options: Sendable {
        public var from: [RedisEndpoint]
        public var to: [RedisEndpoint]
        /// Take the lease even from a node that holds it, and ignore presence keys.
        public var force = false
        /// Count what would move; change nothing.
        public var dryRun = false
        public var requiredFsync: RedisStoreConfiguration.Fsync = .always
        public var allowVolatile = false
        public var timeoutMilliseconds = 5_000

        public init(from: [RedisEndpoint], to: [RedisEndpoint]) {
            self.from = from
            self.to = to
        }
    }

    /// What a run did (or, dry, would do).
    public struct Report: Sendable, Equatable {
        public var usersMoved = 0
        public var keysMoved = 0
        public var usersInPlace = 0
        /// An earlier run with the same lists was interrupted: this one finished it.
        public var resumed = false
        /// Users on each instance of the new list afterwards, in its order (dry: before).
        public var usersPerInstance: [Int] = []
    }

    /// An instance, by where it is: the same Redis database may appear in both lists with
    /// other credentials, and is one instance.
    struct Place: Hashable {
        var host: String
        var port: Int
        var database: Int
        init(_ endpoint: RedisEndpoint) {
            host = endpoint.host
            port = endpoint.port
            database = endpoint.database
        }
        var text: String { "\(host):\(port)/\(database)" }
    }

    let options: Options
    let logger: Logger
    /// Tests: stop with an error after moving this many users (an interrupted run).
    let stopAfterMoves: Int?
    /// Every instance of either list, once: the new list's first, then the rest of the new
    /// list, then those only in the old one.
    private var instances: [(place: Place, endpoint: RedisEndpoint, connection: RedisConnection)] = []
    private let ownerID = "rebalance/" + RedisLease.newOwnerID()

    init(options: Options, logger: Logger, stopAfterMoves: Int? = nil) {
        self.options = options
        self.logger = logger
        self.stopAfterMoves = stopAfterMoves
    }

    /// Runs the whole move. Throws `.other` for a refusal (a live store, a list that does
    /// not match the data, an instance that is not ours), `.io` when Redis fails: then
    /// run it again with the same lists.
    public static func run(_ options: Options, logger: Logger = .silent) throws(StoreError) -> Report {
        var rebalance = RedisRebalance(options: options, logger: logger)
        return try rebalance.run()
    }

    /// The marker every instance holds during a move of these two lists.
    var marker: String {
        let lists = options.from.map { Place($0).text }.joined(separator: ",") + ">" + options.to.map { Place($0).text }.joined(separator: ",")
        let hash = String(StableHash.fnv1a(lists), radix: 16)
        return "rebalance \(String(repeating: "0", count: 16 - hash.count))\(hash)"
    }
    static let retired = "retired"

    mutating func run() throws(StoreError) -> Report {
        let fromPlaces = options.from.map(Place.init), toPlaces = options.to.map(Place.init)
        guard !fromPlaces.isEmpty, !toPlaces.isEmpty else { throw StoreError(.other, "both lists need an instance") }
        guard Set(fromPlaces).count == fromPlaces.count, Set(toPlaces).count == toPlaces.count else {
            throw StoreError(.other, "a list names one instance twice")
        }
        guard fromPlaces != toPlaces else { throw StoreError(.other, "the two lists are the same: nothing to move") }
        try connect()
        let configuration = RedisStoreConfiguration(
            endpoints: options.to, requiredFsync: options.requiredFsync, allowVolatile: options.allowVolatile)
        for instance in instances { _ = try RedisSchema.checkDurability(instance.connection, configuration, logger: logger) }
        var report = Report()
        report.resumed = try checkPlaces(from: fromPlaces, to: toPlaces)
        if !options.dryRun {
            try checkNothingServes()
            try takeOver()
        }
        // Every instance is read before anything moves, so that a user is counted once,
        // where it was, and not again on the instance it moved to.
        var inventory: [[String: [[UInt8]]]] = []
        for instance in instances { inventory.append(try keysByUser(on: instance.connection)) }
        var moves = 0
        for (source, users) in zip(instances, inventory) {
            for (user, keys) in users {
                let target = toPlaces[RedisShards.instance(ofUser: user, count: toPlaces.count)]
                guard target != source.place else {
                    report.usersInPlace += 1
                    continue
                }
                report.usersMoved += 1
                report.keysMoved += keys.count
                if options.dryRun { continue }
                if let stopAfterMoves, moves == stopAfterMoves { throw StoreError(.io, "stopped after \(moves) users (test)") }
                try move(user, keys: keys, from: source.connection, to: connection(of: target))
                moves += 1
            }
        }
        if options.dryRun {
            report.usersPerInstance = [Int](repeating: 0, count: toPlaces.count)
            for users in inventory {
                for user in users.keys { report.usersPerInstance[RedisShards.instance(ofUser: user, count: toPlaces.count)] += 1 }
            }
            return report
        }
        report.usersPerInstance = try verify(to: toPlaces)
        try finish(from: fromPlaces, to: toPlaces)
        logger.info("store_rebalanced", [
            "users_moved": report.usersMoved, "keys_moved": report.keysMoved, "users_in_place": report.usersInPlace,
            "resumed": report.resumed ? "yes" : "no", "instances": toPlaces.count,
        ])
        return report
    }

    private mutating func connect() throws(StoreError) {
        for endpoint in options.to + options.from where !instances.contains(where: { $0.place == Place(endpoint) }) {
            let connection = try RedisConnection(endpoint: endpoint, timeoutMilliseconds: options.timeoutMilliseconds)
            instances.append((Place(endpoint), endpoint, connection))
        }
    }

    /// The instances that hold a lease: the first of each list (one, when both lists
    /// start with the same instance).
    private var leaseInstances: Set<Place> { [Place(options.from[0]), Place(options.to[0])] }

    private func connection(of place: Place) -> RedisConnection {
        instances.first { $0.place == place }!.connection
    }

    private func reply(_ connection: RedisConnection, _ command: RedisCommand) throws(StoreError) -> RedisReply {
        let reply = try connection.run(command)
        if case .error(let message) = reply { throw RedisEventStore.error(fromReply: message, address: connection.endpoint.address) }
        return reply
    }

    /// `RedisConnection.scan` handing `body` each element's bytes: a Redis error is thrown
    /// as such, and a page that is not one, or holds an element that is not a string,
    /// throws `.other`.
    private func scan(_ connection: RedisConnection, _ arguments: [String], cursorAt cursorIndex: Int, _ body: ([UInt8]) -> Bool) throws(StoreError) {
        let address = connection.endpoint.address
        func malformed(_ reply: RedisReply) -> StoreError {
            if case .error(let message) = reply { return RedisEventStore.error(fromReply: message, address: address) }
            return StoreError(.other, "Redis at \(address): \(arguments[0]) did not answer with a page of strings")
        }
        try connection.scan(arguments, cursorAt: cursorIndex, malformed: malformed) { element throws(StoreError) in
            guard case .string(let bytes) = element else { throw malformed(element) }
            return body(bytes)
        }
    }

    /// Each instance must be where one of the lists says, or hold this move's marker (an
    /// interrupted run of the same lists). An instance only in the new list must be
    /// empty (nothing but cluster keys) or hold the marker. Returns whether a marker was
    /// found (a resumed move).
    private func checkPlaces(from: [Place], to: [Place]) throws(StoreError) -> Bool {
        var resumed = false
        for instance in instances {
            let replies = try instance.connection.pipeline([
                RedisCommand("GET", RedisLayout.schemaKey), RedisCommand("GET", RedisLayout.instanceKey),
            ])
            let address = instance.endpoint.address
            let schema = replies[0].text, recorded = replies[1].text
            if recorded == marker {
                resumed = true
                continue
            }
            if let recorded, recorded.hasPrefix("rebalance ") {
                throw StoreError(.other, "Redis at \(address) is marked by an interrupted store-rebalance of other lists "
                    + "(\(recorded)): finish that one first, with its --from and --to")
            }
            var expected: [String] = []
            if let index = from.firstIndex(of: instance.place) { expected.append("\(index)/\(from.count)") }
            if let index = to.firstIndex(of: instance.place) { expected.append("\(index)/\(to.count)") }
            if schema == nil {
                guard from.firstIndex(of: instance.place) == nil else {
                    throw StoreError(.other, "Redis at \(address) is in --from but holds no voipserver store (no \(RedisLayout.schemaKey))")
                }
                if let foreign = try RedisSchema.firstKeyNotOfTheCluster(instance.connection, address: address) {
                    throw StoreError(.other, "Redis at \(address) holds keys (such as '\(foreign)') but no voipserver store: "
                        + "a new instance must be an empty database")
                }
                continue
            }
            guard let version = schema.flatMap({ Int($0) }), version == RedisLayout.schemaVersion else {
                throw StoreError(.other, "Redis at \(address) holds layout version \(schema ?? "?"); this build moves version \(RedisLayout.schemaVersion)")
            }
            let place = recorded ?? "0/1"
            guard expected.contains(place) else {
                throw StoreError(.other, "Redis at \(address) is instance \(place) of its store, but the lists make it "
                    + (expected.isEmpty ? "neither" : expected.joined(separator: " or ")) + ": check --from")
            }
        }
        return resumed
    }

    /// No node may hold the lease (except an interrupted rebalance's) or announce itself,
    /// on the first instance of either list, unless `force`.
    private func checkNothingServes() throws(StoreError) {
        guard !options.force else { return }
        for place in leaseInstances {
            let connection = connection(of: place)
            if let holder = try reply(connection, RedisCommand("GET", RedisLayout.leaseKey)).text, !holder.hasPrefix("rebalance/") {
                throw StoreError(.other, "node \(holder) holds the lease on Redis at \(connection.endpoint.address): stop every "
                    + "voipserver of this store first (or, if that node is dead, wait for its lease to lapse or use --force)")
            }
            var node: String?
            try scan(connection, ["SCAN", "MATCH", RedisNodeLink.presenceKey(of: "*"), "COUNT", "1000"], cursorAt: 1) { key in
                node = String(decoding: key, as: UTF8.self)
                return false
            }
            if let key = node {
                throw StoreError(.other, "a cluster node is running (\(key) on Redis at \(connection.endpoint.address)): stop every "
                    + "voipserver of this store first (or use --force)")
            }
        }
    }

    /// Holds the lease on the first instance of both lists, fences every instance with a
    /// term above any it has seen, and marks every instance.
    private func takeOver() throws(StoreError) {
        for place in leaseInstances {
            _ = try reply(connection(of: place), RedisCommand("SET", RedisLayout.leaseKey, ownerID))
        }
        var term: Int64 = 0
        for instance in instances {
            let held = try reply(instance.connection, RedisCommand("GET", RedisLayout.fenceEpochKey)).text.flatMap { Int64($0) } ?? 0
            term = max(term, held)
        }
        term += 1
        for instance in instances {
            try RedisFence.fence(instance.connection, token: ownerID, term: term)
            _ = try reply(instance.connection, RedisCommand("SET", RedisLayout.schemaKey, String(RedisLayout.schemaVersion), "NX"))
            _ = try reply(instance.connection, RedisCommand("SET", RedisLayout.instanceKey, marker))
        }
        logger.info("store_rebalance_started", ["owner": ownerID, "term": term, "instances": instances.count])
    }

    /// Every user key of the instance (`{u:U}:...`), grouped by user, and the members of
    /// its `voip:users` that have no key (they move too, as an index entry).
    private func keysByUser(on connection: RedisConnection) throws(StoreError) -> [String: [[UInt8]]] {
        var keys: [String: [[UInt8]]] = [:]
        try scan(connection, ["SCAN", "COUNT", "1000"], cursorAt: 1) { name in
            if let user = RedisLayout.user(ofKey: name) { keys[user, default: []].append(name) }
            return true
        }
        try scan(connection, ["SSCAN", RedisLayout.usersKey, "COUNT", "1000"], cursorAt: 2) { member in
            let user = String(decoding: member, as: UTF8.self)
            if keys[user] == nil { keys[user] = [] }
            return true
        }
        // SCAN may return a key twice.
        return keys.mapValues { Array(Set($0)) }
    }

    /// Copies, checks, then deletes: the user's data is whole somewhere at every step.
    private func move(_ user: String, keys: [[UInt8]], from source: RedisConnection, to target: RedisConnection) throws(StoreError) {
        let dumps = try source.pipeline(keys.map { key in
            var command = RedisCommand("DUMP")
            command.append(key)
            return command
        })
        var restores: [RedisCommand] = []
        var copied: [[UInt8]] = []
        for (key, dump) in zip(keys, dumps) {
            switch dump {
            case .string(let payload):
                var command = RedisCommand("RESTORE")
                command.append(key)
                command.append("0")
                command.append(payload)
                command.append("REPLACE")
                restores.append(command)
                copied.append(key)
            case .null: continue  // gone since the scan
            case .error(let message): throw RedisEventStore.error(fromReply: message, address: source.endpoint.address)
            default: throw StoreError(.other, "Redis at \(source.endpoint.address): DUMP answered \(dump)")
            }
        }
        var exists = RedisCommand("EXISTS")
        for key in copied { exists.append(key) }
        restores.append(RedisCommand("SADD", RedisLayout.usersKey, user))
        if !copied.isEmpty { restores.append(exists) }
        let replies = try target.pipeline(restores)
        for reply in replies {
            if case .error(let message) = reply { throw RedisEventStore.error(fromReply: message, address: target.endpoint.address) }
        }
        if !copied.isEmpty, replies.last != .integer(Int64(copied.count)) {
            throw StoreError(.other, "Redis at \(target.endpoint.address): \(user)'s keys did not all arrive (EXISTS answered \(replies.last!))")
        }
        var delete = [RedisCommand("MULTI")]
        if !keys.isEmpty {
            var del = RedisCommand("DEL")
            for key in keys { del.append(key) }
            delete.append(del)
        }
        delete.append(RedisCommand("SREM", RedisLayout.usersKey, user))
        delete.append(RedisCommand("EXEC"))
        let deleted = try source.pipeline(delete)
        guard case .array = deleted.last! else {
            throw StoreError(.other, "Redis at \(source.endpoint.address): deleting \(user)'s moved keys answered \(deleted.last!)")
        }
    }

    /// Every instance holds only users the new list places on it, and those only in the
    /// old list hold none. Returns the users per instance of the new list.
    private func verify(to: [Place]) throws(StoreError) -> [Int] {
        var counts = [Int](repeating: 0, count: to.count)
        for instance in instances {
            let users = try keysByUser(on: instance.connection).keys
            for user in users {
                let index = RedisShards.instance(ofUser: user, count: to.count)
                guard to[index] == instance.place else {
                    throw StoreError(.other, "after the move, Redis at \(instance.endpoint.address) still holds user '\(user)' "
                        + "(placed on \(to[index].text)); run store-rebalance again")
                }
                counts[index] += 1
            }
        }
        return counts
    }

    /// Records each instance's new place, retires those dropped, releases the leases.
    private func finish(from: [Place], to: [Place]) throws(StoreError) {
        for instance in instances {
            let place = to.firstIndex(of: instance.place).map { "\($0)/\(to.count)" } ?? Self.retired
            _ = try reply(instance.connection, RedisCommand("SET", RedisLayout.instanceKey, place))
        }
        for place in leaseInstances {
            _ = try reply(connection(of: place), RedisCommand("EVAL", RedisLease.releaseScript, "1", RedisLayout.leaseKey, ownerID))
        }
    }
}
