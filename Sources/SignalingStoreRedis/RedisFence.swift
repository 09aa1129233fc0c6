import SignalingStore

/// Fencing across the instances of a sharded store (docs/CLUSTER.md, "Fencing: the
/// guarantee"). The lease lives on the first instance only, and the apply script checks
/// it there; every other instance holds a fence key (`voip:fence`) that the script checks
/// in its place (`RedisBatch`'s `fenceKey`). A node that takes the lease fences every
/// other instance with its id before it loads the snapshot and serves, so a deposed
/// holder's late batch is refused (`VSFENCED`) on every instance the new holder reads.
///
/// Fences carry a term number, handed out on the first instance only while the lease
/// holds the caller's id (`takeTermScript`, atomic with the lease check), and an instance
/// takes a fence only with a number above the one it holds (`fenceScript`). So a holder
/// that stalled between taking the lease and fencing cannot, waking late, overwrite the
/// fence of the holder after it: its number is lower, and its open fails instead.
enum RedisFence {
    /// KEYS[1] the lease, KEYS[2] the term counter; ARGV[1] the caller's id. The next term
    /// number, or VSFENCED when the lease does not hold the id.
    static let takeTermScript = """
        if redis.call('GET', KEYS[1]) ~= ARGV[1] then
          return redis.error_reply('VSFENCED this node does not hold the lease ' .. KEYS[1] .. ' (held by ' .. tostring(redis.call('GET', KEYS[1]) or 'nobody') .. ')')
        end
        return redis.call('INCR', KEYS[2])
        """

    /// KEYS[1] the fence, KEYS[2] its term number; ARGV[1] the caller's id, ARGV[2] its
    /// term number. 1 when the fence holds the id afterwards; VSFENCED when a later term
    /// fenced the instance.
    static let fenceScript = """
        local held = tonumber(redis.call('GET', KEYS[2]) or '0')
        local term = tonumber(ARGV[2])
        if held < term then
          redis.call('SET', KEYS[1], ARGV[1])
          redis.call('SET', KEYS[2], ARGV[2])
          return 1
        end
        if held == term and redis.call('GET', KEYS[1]) == ARGV[1] then return 1 end
        return redis.error_reply('VSFENCED a later lease holder fenced this instance (' .. tostring(redis.call('GET', KEYS[1])) .. ', term ' .. held .. ')')
        """

    /// A new term number from the first instance, for `token`, which must hold the lease.
    static func takeTerm(_ connection: RedisConnection, token: String) throws(StoreError) -> Int64 {
        let reply = try connection.run(RedisCommand("EVAL", takeTermScript, "2", RedisLayout.leaseKey, RedisLayout.fenceEpochKey, token))
        switch reply {
        case .integer(let term): return term
        case .error(let message): throw RedisEventStore.error(fromReply: message, address: connection.endpoint.address)
        default: throw StoreError(.other, "Redis at \(connection.endpoint.address): the term script answered \(reply)")
        }
    }

    /// Fences the instance behind `connection` with `token` in `term` (idempotent).
    static func fence(_ connection: RedisConnection, token: String, term: Int64) throws(StoreError) {
        let reply = try connection.run(RedisCommand(
            "EVAL", fenceScript, "2", RedisLayout.fenceKey, RedisLayout.fenceEpochKey, token, String(term)))
        switch reply {
        case .integer(1): return
        case .error(let message): throw RedisEventStore.error(fromReply: message, address: connection.endpoint.address)
        default: throw StoreError(.other, "Redis at \(connection.endpoint.address): the fence script answered \(reply)")
        }
    }
}
