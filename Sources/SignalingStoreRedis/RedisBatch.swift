import SignalingStore

/// A batch of `StoreChange`s as arguments of the apply script (`RedisBatch.script`),
/// grouped by user (`StoreChange.owner`), each user's changes in their order.
///
/// KEYS: `voip:users`, `voip:lease` (or `voip:fence`), then each user's `{u:U}:devices` (the script derives
/// the user's other keys from it, so every key it touches shares a declared key's hash
/// tag). ARGV: the fencing token (the writing node's id, or empty: not fenced), then for
/// each user, the user id, the number of changes, then per change a one-letter code and
/// its arguments (`RedisBatch.script` lists them).
///
/// One EVALSHA applies the whole batch: on a single Redis instance a script is atomic
/// whatever keys it touches. A sharded store (`RedisEventStore` over several instances)
/// runs it once per instance with that instance's users; see docs/STORAGE.md, "Several
/// Redis instances", for why that is safe to retry but not atomic across instances.
struct RedisBatch {
    private(set) var command: RedisCommand
    /// Users in the batch (the number of groups).
    private(set) var users = 0

    /// Encodes the changes; throws `.other` naming the change for a number the store
    /// refuses (beyond 2^63 - 1), before anything is sent.
    ///
    /// - Parameters:
    ///   - fencingToken: when set, Redis applies the batch only while `voip:lease`
    ///     holds exactly this value (`RedisLease`): a node whose lease lapsed cannot write.
    ///   - fenceKey: the key that must hold the token: `voip:lease` on the first (or only)
    ///     instance, `voip:fence` on the others of a sharded store (`RedisFence`).
    ///   - positions, batchCount: where each change stood in the whole batch, when these
    ///     are one instance's share of it, for naming a refused change (default: `changes`
    ///     is the whole batch).
    init(
        _ changes: [StoreChange], scriptSHA: String, fencingToken: String? = nil, fenceKey: String = RedisLayout.leaseKey,
        positions: [Int]? = nil, batchCount: Int? = nil
    ) throws(StoreError) {
        var groups: [String: [Int]] = [:]
        var order: [String] = []
        for (index, change) in changes.enumerated() {
            let owner = change.owner
            if groups[owner] == nil { order.append(owner) }
            groups[owner, default: []].append(index)
        }
        command = RedisCommand("EVALSHA", scriptSHA, String(order.count + 2))
        command.append(RedisLayout.usersKey)
        command.append(fenceKey)
        for user in order { command.append(RedisLayout.devicesKey(user)) }
        command.append(fencingToken ?? "")
        for user in order {
            let indices = groups[user]!
            command.append(user)
            command.append(String(indices.count))
            for index in indices {
                do throws(StoreError) {
                    try append(changes[index])
                } catch {
                    throw StoreError(error.kind, "change \((positions?[index] ?? index) + 1) of \(batchCount ?? changes.count) "
                        + "(\(changes[index].summary)): \(error.message)")
                }
            }
        }
        users = order.count
    }

    /// The code and arguments of one change.
    private mutating func append(_ change: StoreChange) throws(StoreError) {
        /// A number and the exclusive end of its range (`number + 1`).
        func range(_ value: UInt64, _ what: String) throws(StoreError) {
            let checked = try RedisLayout.checkedSequence(value, what)
            command.append(RedisLayout.digits(checked))
            command.append(RedisLayout.digits(checked + 1))
        }
        switch change {
        case .upsertDevice(_, let device, let sessionID, let lastSeen):
            command.append("U")
            command.append(device)
            command.append(DeviceRecord.sessionPart(sessionID, lastSeen: lastSeen))
        case .appendEvent(_, let device, let event):
            command.append("A")
            command.append(device)
            try range(event.seq, "seq")
            command.append(EventRecord.tail(of: event))
        case .acknowledge(_, let device, let through):
            command.append("K")
            command.append(device)
            try range(through, "acknowledged seq")
        case .reserveSequence(_, let device, let through):
            command.append("R")
            command.append(device)
            command.append(RedisLayout.digits(try RedisLayout.checkedSequence(through, "reserved seq")))
        case .removeDevice(_, let device):
            command.append("X")
            command.append(device)
        case .holdForUser(_, let event):
            command.append("H")
            try range(event.seq, "ordinal")
            command.append(EventRecord.tail(of: event))
        case .claimHeldEvent(_, let device, let seq, let ordinal):
            command.append("C")
            command.append(device)
            try range(seq, "seq")
            try range(ordinal, "ordinal")
        case .releaseHeld(_, let through):
            command.append("L")
            command.append(RedisLayout.digits(try RedisLayout.checkedSequence(through, "released ordinal") + 1))
        case .rememberMessageID(let remembered):
            command.append("M")
            command.append(remembered.messageID)
            command.append(MessageIDRecord.encode(remembered))
        case .forgetMessageID(_, let messageID, _):
            command.append("F")
            command.append(messageID)
        case .registerPush(_, let device, let registration):
            command.append("P")
            command.append(device)
            command.append(registration.kind.rawValue)
            command.append(PushRecord.encode(registration))
        case .removePush(_, let device, let kind):
            command.append("Q")
            command.append(device)
            command.append(kind.rawValue)
        case .withdrawEvent(_, let device, let seq):
            command.append("W")
            command.append(device)
            try range(seq, "withdrawn seq")
        case .withdrawHeld(_, let ordinal):
            command.append("V")
            try range(ordinal, "withdrawn ordinal")
        }
    }

    /// Applies a batch encoded as above, all or nothing: pass 1 reads and checks every key
    /// and device record the batch touches and writes nothing, so that anything that
    /// could fail midway (a key of the wrong type, a damaged record) fails before the
    /// first write (Redis does not undo a script's writes when it fails); pass 2 writes.
    ///
    /// Idempotent: applying a batch twice in a row leaves what applying it once does (the
    /// store writer retries a batch whose reply it did not get, and the script may have
    /// run). So an event or held event whose number is stored already is replaced rather
    /// than refused, and changes for a device that is not stored are skipped (counted in
    /// the reply) rather than refused: a retried batch that removes a device would
    /// otherwise fail on its own earlier changes for it.
    ///
    /// Codes and arguments (N = 20-digit number, E = its exclusive end, N + 1):
    /// U device session+lastSeen | A device N E tail | K device N E | R device N |
    /// X device | H N E tail | C device N E ordinal ordinalEnd | L E | M id record |
    /// F id | P device kind record | Q device kind | W device N E | V N E.
    /// Returns the number of changes skipped for want of their device.
    ///
    /// Fencing: with a token (ARGV[1]), the script first checks that the lease key holds
    /// it and otherwise refuses the whole batch (VSFENCED) before reading anything else.
    /// Redis runs a script alone, so no other node can take the lease between the check
    /// and the writes: a batch of a node that lost its lease, however late it arrives,
    /// is refused by Redis itself.
    static let script = """
        if ARGV[1] ~= '' and redis.call('GET', KEYS[2]) ~= ARGV[1] then
          return redis.error_reply('VSFENCED this node does not hold the lease ' .. KEYS[2] .. ' (held by ' .. tostring(redis.call('GET', KEYS[2]) or 'nobody') .. ')')
        end
        local ZERO = string.rep('0', 20)
        local nargs = {U=2, A=4, K=3, R=2, X=1, H=3, C=5, L=1, M=2, F=1, P=3, Q=2, W=3, V=2}
        local deviceOps = {U=true, A=true, K=true, R=true, X=true, C=true, P=true, W=true}
        local groups = {}
        local a = 2
        -- Pass 1: read and check; nothing is written before every check passed.
        for g = 3, #KEYS do
          local devices = KEYS[g]
          local p = string.sub(devices, 1, #devices - 7)
          local group = {devices = devices, p = p, user = ARGV[a], count = tonumber(ARGV[a + 1]), first = a + 2, recs = {}}
          groups[#groups + 1] = group
          a = a + 2
          local want = {}
          local function expect(key, kind)
            if want[key] then return nil end
            want[key] = true
            local found = redis.call('TYPE', key)['ok']
            if found ~= 'none' and found ~= kind then
              return 'VSCORRUPT key ' .. key .. ' is a ' .. found .. ', not a ' .. kind
            end
            return nil
          end
          local problem = expect(devices, 'hash')
          if problem then return redis.error_reply(problem) end
          for i = 1, group.count do
            local op = ARGV[a]
            local n = nargs[op]
            if n == nil then return redis.error_reply('VSBAD unknown change code ' .. tostring(op)) end
            local d = ARGV[a + 1]
            if op == 'A' or op == 'K' or op == 'W' or op == 'C' or op == 'X' then problem = problem or expect(p .. 'q:' .. d, 'zset') end
            if op == 'X' or op == 'P' or op == 'Q' then problem = problem or expect(p .. 'push:' .. d, 'hash') end
            if op == 'H' or op == 'C' or op == 'L' or op == 'V' then problem = problem or expect(p .. 'held', 'zset') end
            if op == 'M' or op == 'F' then problem = problem or expect(p .. 'mid', 'hash') end
            if problem then return redis.error_reply(problem) end
            if deviceOps[op] and group.recs[d] == nil then
              local r = redis.call('HGET', devices, d)
              if r and #r ~= 64 then return redis.error_reply('VSCORRUPT device ' .. d .. ' of ' .. devices .. ' is not a device record') end
              group.recs[d] = r or false
            end
            a = a + 1 + n
          end
        end
        -- Pass 2: write.
        local skipped = 0
        for _, group in ipairs(groups) do
          local devices, p, recs = group.devices, group.p, group.recs
          local held, mid = p .. 'held', p .. 'mid'
          local dirty, order = {}, {}
          local grew, shrank = false, false
          local function touch(d)
            if not dirty[d] then dirty[d] = true; order[#order + 1] = d end
          end
          -- Counters only rise; bytes 1-20 are ackedSeq, 21-40 lastSeq.
          local function raise(d, last, acked)
            local r = recs[d]
            local ra, rl = string.sub(r, 1, 20), string.sub(r, 21, 40)
            if last > rl then rl = last end
            if acked and acked > ra then ra = acked end
            recs[d] = ra .. rl .. string.sub(r, 41)
            touch(d)
          end
          local function put(key, n, e, tail)
            redis.call('ZREMRANGEBYLEX', key, '[' .. n, '(' .. e)
            redis.call('ZADD', key, 0, n .. tail)
            grew = true
          end
          a = group.first
          for i = 1, group.count do
            local op, x1, x2, x3, x4, x5 = ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[a + 5]
            a = a + 1 + nargs[op]
            if op == 'U' then
              local r = recs[x1]
              if r then recs[x1] = string.sub(r, 1, 40) .. x2 else recs[x1] = ZERO .. ZERO .. x2 end
              touch(x1)
              grew = true
            elseif op == 'X' then
              recs[x1] = false
              touch(x1)
              redis.call('DEL', p .. 'q:' .. x1, p .. 'push:' .. x1)
              shrank = true
            elseif op == 'H' then
              put(held, x1, x2, x3)
            elseif op == 'L' then
              redis.call('ZREMRANGEBYLEX', held, '-', '(' .. x1)
              shrank = true
            elseif op == 'V' then
              redis.call('ZREMRANGEBYLEX', held, '[' .. x1, '(' .. x2)
              shrank = true
            elseif op == 'M' then
              redis.call('HSET', mid, x1, x2)
              grew = true
            elseif op == 'F' then
              redis.call('HDEL', mid, x1)
              shrank = true
            elseif op == 'Q' then
              redis.call('HDEL', p .. 'push:' .. x1, x2)
            elseif not recs[x1] then
              skipped = skipped + 1
            elseif op == 'A' then
              put(p .. 'q:' .. x1, x2, x3, x4)
              raise(x1, x2)
            elseif op == 'K' then
              redis.call('ZREMRANGEBYLEX', p .. 'q:' .. x1, '-', '(' .. x3)
              raise(x1, x2, x2)
            elseif op == 'R' then
              raise(x1, x2)
            elseif op == 'W' then
              redis.call('ZREMRANGEBYLEX', p .. 'q:' .. x1, '[' .. x2, '(' .. x3)
              raise(x1, x2)
            elseif op == 'C' then
              raise(x1, x2)
              local found = redis.call('ZRANGEBYLEX', held, '[' .. x4, '(' .. x5, 'LIMIT', 0, 1)
              if found[1] then put(p .. 'q:' .. x1, x2, x3, string.sub(found[1], 21)) end
            elseif op == 'P' then
              redis.call('HSET', p .. 'push:' .. x1, x2, x3)
            end
          end
          for _, d in ipairs(order) do
            if recs[d] then redis.call('HSET', devices, d, recs[d]) else redis.call('HDEL', devices, d) end
          end
          -- The index lists the users with anything stored (a SADD that adds nothing is
          -- not written to the AOF).
          if shrank and redis.call('HLEN', devices) == 0 and redis.call('ZCARD', held) == 0 and redis.call('HLEN', mid) == 0 then
            redis.call('SREM', KEYS[1], group.user)
          elseif grew then
            redis.call('SADD', KEYS[1], group.user)
          end
        end
        return skipped
        """
}
