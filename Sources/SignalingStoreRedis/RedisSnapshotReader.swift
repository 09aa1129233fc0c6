import SignalingStore

/// Reads everything a single node loads at start: the users in `voip:users`, then each
/// user's keys, a few hundred users per round trip (pipelined), so the cost is linear in
/// what is stored and the number of round trips in the number of users / `usersPerRound`.
///
/// Not one consistent read across users (nor across the instances of a sharded store): it
/// runs before the server starts, when nothing else writes to the store (the lease holder
/// is the only writer, and a sharded store fences every instance before it reads).
struct RedisSnapshotReader {
    let connection: RedisConnection
    static let usersPerRound = 256

    func read() throws(StoreError) -> StoredSnapshot {
        var snapshot = StoredSnapshot()
        try read(into: &snapshot)
        snapshot.sort()
        return snapshot
    }

    /// Adds what this instance holds to `snapshot` (a sharded store reads every instance
    /// into one, then sorts it once). `instance` of `count`: every user found must be one
    /// `RedisShards` places here; a user found elsewhere means the list of instances does
    /// not match the data (reordered, or grown without moving users): refused (`.corrupt`).
    func read(into snapshot: inout StoredSnapshot, instance: Int = 0, of count: Int = 1) throws(StoreError) {
        let users = try readUsers()
        if count > 1, let stray = users.first(where: { RedisShards.instance(ofUser: $0, count: count) != instance }) {
            throw StoreError(.corrupt, "Redis at \(connection.endpoint.address) (instance \(instance) of \(count)) holds user '\(stray)', "
                + "whom the list of instances places on instance \(RedisShards.instance(ofUser: stray, count: count)): "
                + "the users were not moved when the list changed (docs/STORAGE.md, \"Adding an instance\")")
        }
        var start = 0
        while start < users.count {
            let round = Array(users[start..<min(users.count, start + Self.usersPerRound)])
            start += round.count
            try read(round, into: &snapshot)
        }
    }

    /// SSCAN, not SMEMBERS: Redis serves other clients between the pages.
    private func readUsers() throws(StoreError) -> [String] {
        var users = Set<String>()  // SSCAN may return a member twice
        try connection.scan(["SSCAN", RedisLayout.usersKey, "COUNT", "1000"], cursorAt: 2, malformed: { unexpected("SSCAN", $0) }) {
            member throws(StoreError) in
            guard case .string(let bytes) = member else { throw unexpected("SSCAN", member) }
            users.insert(String(decoding: bytes, as: UTF8.self))
            return true
        }
        return users.sorted { $0.utf8.lexicographicallyPrecedes($1.utf8) }
    }

    private func read(_ users: [String], into snapshot: inout StoredSnapshot) throws(StoreError) {
        var commands: [RedisCommand] = []
        for user in users {
            commands.append(command("HGETALL", RedisLayout.devicesKey(user)))
            commands.append(range(RedisLayout.heldKey(user)))
            commands.append(command("HGETALL", RedisLayout.messageIDsKey(user)))
        }
        let replies = try connection.pipeline(commands)
        var devices: [StoredDevice] = []
        for (index, user) in users.enumerated() {
            for (field, value) in try pairs(replies[3 * index], "HGETALL devices of \(user)") {
                devices.append(try DeviceRecord.decode(value, user: user, device: String(decoding: field, as: UTF8.self)))
            }
            let held = try events(replies[3 * index + 1], key: RedisLayout.heldKey(user))
            if !held.isEmpty { snapshot.held[user] = held }
            for (field, value) in try pairs(replies[3 * index + 2], "HGETALL message ids of \(user)") {
                snapshot.messageIDs.append(try MessageIDRecord.decode(value, sender: user, messageID: String(decoding: field, as: UTF8.self)))
            }
        }
        guard !devices.isEmpty else { return }
        commands = []
        for device in devices {
            commands.append(range(RedisLayout.queueKey(device.userID, device.deviceID)))
            commands.append(command("HGETALL", RedisLayout.pushKey(device.userID, device.deviceID)))
        }
        let perDevice = try connection.pipeline(commands)
        for index in devices.indices {
            let device = devices[index]
            devices[index].events = try events(perDevice[2 * index], key: RedisLayout.queueKey(device.userID, device.deviceID))
            for (_, value) in try pairs(perDevice[2 * index + 1], "HGETALL push of \(device.userID)/\(device.deviceID)") {
                // `register` keeps them in kind order, one per kind.
                devices[index].pushRegistrations.register(try PushRecord.decode(value, user: device.userID, device: device.deviceID))
            }
        }
        snapshot.devices += devices
    }

    private func command(_ name: String, _ key: [UInt8]) -> RedisCommand {
        var command = RedisCommand(name)
        command.append(key)
        return command
    }

    /// A whole queue or held set, in number order (the members' byte order).
    private func range(_ key: [UInt8]) -> RedisCommand {
        var command = RedisCommand("ZRANGE")
        command.append(key)
        command.append("0")
        command.append("-1")
        return command
    }

    private func events(_ reply: RedisReply, key: [UInt8]) throws(StoreError) -> [StoredEvent] {
        let name = String(decoding: key, as: UTF8.self)
        guard case .array(let members) = reply else { throw unexpected("ZRANGE \(name)", reply) }
        var events: [StoredEvent] = []
        events.reserveCapacity(members.count)
        for member in members {
            guard case .string(let bytes) = member else { throw unexpected("ZRANGE \(name)", reply) }
            events.append(try EventRecord.decode(bytes, in: name))
        }
        return events
    }

    private func pairs(_ reply: RedisReply, _ what: String) throws(StoreError) -> [(field: [UInt8], value: [UInt8])] {
        guard case .array(let items) = reply, items.count % 2 == 0 else { throw unexpected(what, reply) }
        var pairs: [(field: [UInt8], value: [UInt8])] = []
        pairs.reserveCapacity(items.count / 2)
        for index in stride(from: 0, to: items.count, by: 2) {
            guard case .string(let field) = items[index], case .string(let value) = items[index + 1] else { throw unexpected(what, reply) }
            pairs.append((field, value))
        }
        return pairs
    }

    private func unexpected(_ what: String, _ reply: RedisReply) -> StoreError {
        if case .error(let message) = reply { return RedisEventStore.error(fromReply: message, address: connection.endpoint.address) }
        return StoreError(.corrupt, "\(what): unexpected reply")
    }
}
