import SignalingStore
import SignalingSupport

/// What the store checks on every connection, first and later ones alike: Redis may have
/// been restarted with other settings or without its data in between.
enum RedisSchema {
    /// The AOF settings Redis reports.
    struct Durability: Equatable {
        var appendOnly: String
        var appendFsync: String
    }

    /// Reads `appendonly` and `appendfsync` and refuses (`.other`) a Redis that does not
    /// meet `configuration.requiredFsync`, unless `allowVolatile` (then it logs a warning).
    /// Returns what Redis reported (nil when CONFIG GET is refused and that is allowed).
    static func checkDurability(_ connection: RedisConnection, _ configuration: RedisStoreConfiguration, logger: Logger)
        throws(StoreError) -> Durability?
    {
        let replies = try connection.pipeline([RedisCommand("CONFIG", "GET", "appendonly"), RedisCommand("CONFIG", "GET", "appendfsync")])
        let address = connection.endpoint.address
        guard case .array(let appendOnly) = replies[0], appendOnly.count == 2, let appendOnlyValue = appendOnly[1].text,
              case .array(let appendFsync) = replies[1], appendFsync.count == 2, let appendFsyncValue = appendFsync[1].text
        else {
            let reason = "cannot read Redis's AOF settings at \(address) (CONFIG GET answered \(replies[0]))"
            guard configuration.allowVolatile else {
                throw StoreError(.other, "\(reason); refusing to run without knowing that accepted messages are durable "
                    + "(allow it with --redis-allow-volatile)")
            }
            logger.warning("store_durability_unknown", ["address": address, "detail": reason])
            return nil
        }
        let durability = Durability(appendOnly: appendOnlyValue, appendFsync: appendFsyncValue)
        if !configuration.requiredFsync.isMet(appendOnly: appendOnlyValue, appendFsync: appendFsyncValue) {
            let found = appendOnlyValue == "yes" ? "appendonly yes, appendfsync \(appendFsyncValue)" : "appendonly \(appendOnlyValue) (no AOF)"
            let wanted = "appendonly yes and appendfsync \(configuration.requiredFsync == .always ? "always" : "everysec or always")"
            guard configuration.allowVolatile else {
                throw StoreError(.other, "Redis at \(address) runs with \(found), weaker than required (--redis-fsync "
                    + "\(configuration.requiredFsync.rawValue) needs \(wanted)): accepted messages could be lost. "
                    + "Set it in redis.conf (or CONFIG SET and CONFIG REWRITE), lower --redis-fsync, or accept the loss "
                    + "with --redis-allow-volatile")
            }
            logger.warning("store_volatile", ["address": address, "redis": found, "required": wanted,
                "detail": "--redis-allow-volatile: accepted messages can be lost when Redis stops"])
        }
        return durability
    }

    /// What `prepare` found.
    enum Found: Equatable {
        /// An empty database: the version key was written.
        case created
        /// The current version.
        case current
    }

    /// Checks the layout version key. On the first connection an empty database is made
    /// ours; one that holds other keys and no version is refused (`.corrupt`: not ours),
    /// and so is a newer version. On a later connection (`firstConnection` false) a
    /// missing key means Redis lost the store since it was opened (restarted without its
    /// AOF, flushed): refused too, since the server's memory no longer matches it.
    ///
    /// `instance` of `count`: this database's place in the store's list (`RedisShards`).
    /// A new layout records it (`RedisLayout.instanceKey`); an existing one must match it
    /// (one without the key is the store of one instance it was before sharding), else
    /// the list was reordered or grown and users would be looked for on the wrong
    /// instances: refused (`.other`), pointing at the migration.
    static func prepare(_ connection: RedisConnection, firstConnection: Bool, instance: Int = 0, of count: Int = 1)
        throws(StoreError) -> Found
    {
        let address = "Redis at \(connection.endpoint.address) database \(connection.endpoint.database)"
        let place = "\(instance)/\(count)"
        let replies = try connection.pipeline([RedisCommand("GET", RedisLayout.schemaKey), RedisCommand("GET", RedisLayout.instanceKey)])
        if case .error(let message) = replies[1] { throw RedisEventStore.error(fromReply: message, address: address) }
        let recorded = replies[1].text ?? "0/1"
        if recorded.hasPrefix("rebalance ") {
            throw StoreError(.other, "\(address) is being moved by voipserver store-rebalance, or a move was interrupted "
                + "(\(RedisLayout.instanceKey) is '\(recorded)'): run store-rebalance again with the same --from and --to to finish it")
        }
        if recorded == RedisRebalance.retired {
            throw StoreError(.other, "\(address) was removed from its store by voipserver store-rebalance: leave it out of the list")
        }
        if replies[0] != .null && recorded != place {
            throw StoreError(.other, "\(address) is instance \(recorded) (index/count) of its store, but the list of Redis "
                + "instances makes it \(place): users are placed by the list's order and length, so a reordered or longer "
                + "list needs the users moved first (docs/STORAGE.md, \"Adding an instance\")")
        }
        switch replies[0] {
        case .string(let bytes):
            let text = String(decoding: bytes, as: UTF8.self)
            guard let version = Int(text), version >= 1 else {
                throw StoreError(.corrupt, "\(address): \(RedisLayout.schemaKey) is '\(text)', not a voipserver layout version")
            }
            guard version <= RedisLayout.schemaVersion else {
                throw StoreError(.corrupt, "\(address) was written by a newer voipserver (layout version \(version); "
                    + "this build understands up to \(RedisLayout.schemaVersion))")
            }
            // Version 1 is the first: nothing to upgrade yet.
            return .current
        case .null:
            guard firstConnection else {
                throw StoreError(.corrupt, "\(address) lost the store since the server opened it (no \(RedisLayout.schemaKey) key: "
                    + "restarted without its AOF, or flushed); restart voipserver to load what Redis holds now")
            }
            // The lease is taken, and the cluster's nodes announce their presence, before
            // the store opens: a database that holds only those keys is empty.
            if let foreign = try firstKeyNotOfTheCluster(connection, address: address) {
                throw StoreError(.corrupt, "\(address) holds keys (such as '\(foreign)') but no \(RedisLayout.schemaKey): not a voipserver store; "
                    + "give the server a database of its own (redis://HOST:PORT/DB)")
            }
            let replies = try connection.pipeline([
                RedisCommand("SET", RedisLayout.instanceKey, place),
                RedisCommand("SET", RedisLayout.schemaKey, String(RedisLayout.schemaVersion), "NX"),
            ])
            for reply in replies {
                if case .error(let message) = reply { throw RedisEventStore.error(fromReply: message, address: address) }
            }
            return .created
        case .error(let message):
            throw RedisEventStore.error(fromReply: message, address: address)
        default:
            throw StoreError(.corrupt, "\(address): \(RedisLayout.schemaKey) is not a string")
        }
    }

    /// Keys a cluster writes before the store opens (the lease, the fences of a sharded
    /// store's later terms on an instance added empty) and the instance key a store's
    /// creation interrupted after its first write.
    private static let clusterKeys: Set<String> = [RedisLayout.leaseKey, RedisLayout.fenceKey, RedisLayout.fenceEpochKey, RedisLayout.instanceKey]

    /// A key that is neither the lease nor a node's presence key (`RedisNodeLink`), or nil.
    /// DBSIZE first: an empty database costs one command; otherwise SCAN pages until the
    /// first such key, which in a foreign database is on the first page, and in a new
    /// cluster's walks only the few presence keys.
    static func firstKeyNotOfTheCluster(_ connection: RedisConnection, address: String) throws(StoreError) -> String? {
        guard case .integer(let size) = try connection.run(RedisCommand("DBSIZE")) else {
            throw StoreError(.other, "\(address): DBSIZE did not answer with a number")
        }
        guard size > 0 else { return nil }
        let presencePrefix = RedisNodeLink.presenceKey(of: "")
        var found: String?
        try connection.scan(["SCAN", "COUNT", "100"], cursorAt: 1, malformed: { _ in
            StoreError(.other, "\(address): SCAN did not answer with a page")
        }) { key in
            guard let name = key.text, !clusterKeys.contains(name), !name.hasPrefix(presencePrefix) else { return true }
            found = name
            return false
        }
        return found
    }
}
