import SignalingStore

/// How the Redis store connects and what it requires of the Redis server.
public struct RedisStoreConfiguration: Sendable, Equatable {
    /// The weakest AOF setting the store accepts (docs/STORAGE.md, "Redis": durability).
    public enum Fsync: String, Sendable, Equatable, CaseIterable {
        /// `appendonly yes` with `appendfsync always`: Redis fsyncs the AOF before it
        /// answers, so an applied batch survives a crash of Redis and of its machine.
        case always
        /// `appendonly yes` with `appendfsync everysec` (or `always`): an applied batch
        /// survives a crash of the Redis process, but a crash of its machine can lose
        /// about the last second (two, if an fsync is slow).
        case everysec

        /// Whether Redis's `appendonly` / `appendfsync` meet this requirement.
        func isMet(appendOnly: String, appendFsync: String) -> Bool {
            guard appendOnly == "yes" else { return false }
            switch self {
            case .always: return appendFsync == "always"
            case .everysec: return appendFsync == "always" || appendFsync == "everysec"
            }
        }
    }

    /// The store's Redis instances, in order (`RedisShards`): users are spread over them by
    /// a hash of the user id, so the list's length and order are part of the data (the
    /// store refuses a list that does not match what the instances recorded). The first
    /// also holds the lease. One instance: the unsharded store.
    public var endpoints: [RedisEndpoint]
    /// The first instance (the only one of an unsharded store).
    public var endpoint: RedisEndpoint {
        get { endpoints[0] }
        set { endpoints[0] = newValue }
    }
    public var requiredFsync: Fsync
    /// Accept a Redis whose AOF is off or weaker than `requiredFsync` (or whose settings
    /// cannot be read): a warning instead of a refusal. Acknowledged messages can then be
    /// lost when Redis stops.
    public var allowVolatile: Bool
    /// Bounds the connect and every reply. A Redis that does not answer within it fails
    /// the batch (`.io`); the server then refuses new messages and retries.
    public var timeoutMilliseconds: Int
    /// After a failed connect the next attempt waits this long, doubling up to
    /// `longestReconnectDelayMilliseconds`; calls meanwhile fail at once with `.io`.
    public var firstReconnectDelayMilliseconds: Int
    public var longestReconnectDelayMilliseconds: Int
    /// The node id of this node's `RedisLease`: every batch is then applied only while
    /// the lease holds it (fencing, `RedisBatch.script`). Nil: unfenced, for a store used
    /// without a lease (tools, tests).
    public var fencingToken: String?

    public init(
        endpoint: RedisEndpoint, requiredFsync: Fsync = .always, allowVolatile: Bool = false,
        timeoutMilliseconds: Int = 5_000, firstReconnectDelayMilliseconds: Int = 100, longestReconnectDelayMilliseconds: Int = 2_000,
        fencingToken: String? = nil
    ) {
        self.init(
            endpoints: [endpoint], requiredFsync: requiredFsync, allowVolatile: allowVolatile, timeoutMilliseconds: timeoutMilliseconds,
            firstReconnectDelayMilliseconds: firstReconnectDelayMilliseconds,
            longestReconnectDelayMilliseconds: longestReconnectDelayMilliseconds, fencingToken: fencingToken)
    }

    /// - Parameter endpoints: at least one.
    public init(
        endpoints: [RedisEndpoint], requiredFsync: Fsync = .always, allowVolatile: Bool = false,
        timeoutMilliseconds: Int = 5_000, firstReconnectDelayMilliseconds: Int = 100, longestReconnectDelayMilliseconds: Int = 2_000,
        fencingToken: String? = nil
    ) {
        self.fencingToken = fencingToken
        precondition(!endpoints.isEmpty, "a Redis store needs an instance")
        self.endpoints = endpoints
        self.requiredFsync = requiredFsync
        self.allowVolatile = allowVolatile
        self.timeoutMilliseconds = timeoutMilliseconds
        self.firstReconnectDelayMilliseconds = firstReconnectDelayMilliseconds
        self.longestReconnectDelayMilliseconds = longestReconnectDelayMilliseconds
    }
}
