import SignalingStore
import SignalingSupport
#if canImport(Glibc)
import Glibc
#endif

/// The lease that makes one node the only writer of a Redis database (docs/CLUSTER.md):
/// the key `voip:lease` holds the active node's owner id with a TTL. Taken with
/// `SET voip:lease ID NX PX ttl`, extended and released by owner-checked scripts (only
/// while the value is still this node's id), so a node never extends or deletes a lease
/// another node took after its own expired. Every take uses a new id (`ownerID`), so
/// that each active term's batches carry a fencing token of their own.
///
/// The lease alone does not stop a stalled node from writing late: `RedisBatch.script`
/// checks it inside Redis (fencing, `RedisStoreConfiguration.fencingToken`), which does.
///
/// Its own connection (not the store writer's), with a short I/O timeout: a call returns
/// within four `ioTimeout`s (connect, AUTH, SELECT, the command), a fifth of the TTL, so
/// the lease thread is never held past the moment it must step down (a quarter TTL before
/// the lease can expire, `LeaseTerm`). Any I/O failure drops the connection; the
/// next call connects again.
///
/// Confinement: one thread at a time (the node's lease thread), hence `@unchecked Sendable`.
public final class RedisLease: StoreLease, @unchecked Sendable {
    public let endpoint: RedisEndpoint
    public let ttl: Duration
    /// The id of this node's current (or last) take of the lease.
    public private(set) var ownerID: String
    /// Bounds each connect and each reply.
    public let ioTimeout: Duration
    private var connection: RedisConnection?
    /// An id sent with `SET NX` whose reply never came: Redis may hold it. The next
    /// `acquire` adopts it if so (it was never used by a term, so it fences nothing).
    private var unconfirmed: String?
    /// Makes the id of each take (tests give fixed ones).
    private let makeOwnerID: @Sendable () -> String

    /// Extends the lease only if it is still ours: KEYS[1] the lease, ARGV[1] our id,
    /// ARGV[2] the TTL in ms. 1 extended, 0 not ours (expired or another node's).
    static let refreshScript = """
        if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
        return 0
        """
    /// Deletes the lease only if it is still ours. 1 deleted, 0 not ours.
    static let releaseScript = """
        if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
        return 0
        """

    /// - Parameters:
    ///   - ttl: how long the lease lasts after each acquire or refresh (at least 300 ms).
    ///   - ownerIDs: makes the id of each take; defaults to `RedisLease.newOwnerID()`.
    ///   - ioTimeout: defaults to a twentieth of the TTL (at least 10 ms, at most 1 s).
    public init(
        endpoint: RedisEndpoint, ttl: Duration, ownerIDs: @escaping @Sendable () -> String = RedisLease.newOwnerID,
        ioTimeout: Duration? = nil
    ) {
        self.endpoint = endpoint
        self.ttl = ttl
        makeOwnerID = ownerIDs
        ownerID = ownerIDs()
        self.ioTimeout = ioTimeout ?? min(.seconds(1), max(.milliseconds(10), ttl / 20))
    }

    /// `HOST/PID/RANDOM`: random per take (a node never mistakes an earlier take's lease,
    /// its own previous term's or its previous life's, for its current one), the host and
    /// pid for people reading `GET voip:lease` or a log.
    public static func newOwnerID() -> String {
        var name = [CChar](repeating: 0, count: 256)
        let host = gethostname(&name, name.count - 1) == 0
            ? String(decoding: name.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self) : "unknown"
        let random = String(UInt64.random(in: 0...UInt64.max), radix: 16)
        return "\(host)/\(getpid())/\(String(repeating: "0", count: 16 - random.count))\(random)"
    }

    public func acquire() throws(StoreError) -> Bool {
        if let candidate = unconfirmed, try extend(candidate) {
            ownerID = candidate
            unconfirmed = nil
            return true
        }
        let candidate = makeOwnerID()
        unconfirmed = candidate
        let reply = try run(RedisCommand("SET", RedisLayout.leaseKey, candidate, "NX", "PX", String(ttl.milliseconds)))
        unconfirmed = nil
        switch reply {
        case .status("OK"):
            ownerID = candidate
            return true
        case .null: return false  // another node holds it
        default: throw unexpected("SET NX", reply)
        }
    }

    public func refresh() throws(StoreError) -> Bool { try extend(ownerID) }

    public func release() {
        _ = try? run(RedisCommand("EVAL", Self.releaseScript, "1", RedisLayout.leaseKey, ownerID))
    }

    /// Extends the lease by the TTL if it holds `id`.
    private func extend(_ id: String) throws(StoreError) -> Bool {
        let reply = try run(RedisCommand("EVAL", Self.refreshScript, "1", RedisLayout.leaseKey, id, String(ttl.milliseconds)))
        guard case .integer(let extended) = reply else { throw unexpected("the refresh script", reply) }
        return extended == 1
    }

    public func holder() -> String? {
        guard let reply = try? run(RedisCommand("GET", RedisLayout.leaseKey)) else { return nil }
        return reply.text
    }

    /// Runs one command, connecting first if needed; an I/O failure drops the connection.
    private func run(_ command: RedisCommand) throws(StoreError) -> RedisReply {
        do throws(StoreError) {
            let connection: RedisConnection
            if let existing = self.connection {
                connection = existing
            } else {
                connection = try RedisConnection(endpoint: endpoint, timeoutMilliseconds: Int(max(1, ioTimeout.milliseconds)))
                self.connection = connection
            }
            let reply = try connection.run(command)
            if case .error(let message) = reply { throw RedisEventStore.error(fromReply: message, address: endpoint.address) }
            return reply
        } catch {
            if error.kind == .io { connection = nil }
            throw error
        }
    }

    private func unexpected(_ what: String, _ reply: RedisReply) -> StoreError {
        StoreError(.other, "Redis at \(endpoint.address): \(what) answered \(reply)")
    }
}
