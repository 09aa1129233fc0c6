import CHiredisShims
import SignalingStore

/// One command's arguments, laid end to end the way `vs_redis_append` takes them: building
/// a command is appending to two arrays, whatever the number of arguments.
struct RedisCommand {
    private(set) var data: [UInt8] = []
    private(set) var lengths: [Int] = []

    init(_ arguments: String...) {
        for argument in arguments { append(argument) }
    }

    mutating func append(_ argument: String) {
        data.append(contentsOf: argument.utf8)
        lengths.append(argument.utf8.count)
    }

    mutating func append(_ argument: [UInt8]) {
        data.append(contentsOf: argument)
        lengths.append(argument.count)
    }

    var count: Int { lengths.count }
}

/// A reply, copied out of hiredis's tree.
enum RedisReply: Equatable {
    case string([UInt8])
    case status(String)
    case integer(Int64)
    case array([RedisReply])
    case null
    /// Redis refused the command (the connection stays usable).
    case error(String)

    var text: String? {
        switch self {
        case .string(let bytes): return String(decoding: bytes, as: UTF8.self)
        case .status(let text): return text
        default: return nil
        }
    }
}

/// A synchronous connection to one Redis server through hiredis, with a timeout on the
/// connect and on every reply. Any I/O failure (refused, reset, timed out) makes it
/// unusable: the caller drops it and connects again, so a late reply can never be taken
/// for the answer to a later command.
///
/// Confinement: one thread at a time (the store's rule), hence `@unchecked Sendable`.
final class RedisConnection: @unchecked Sendable {
    private let handle: OpaquePointer
    let endpoint: RedisEndpoint

    /// Connects, authenticates and selects the endpoint's database. Throws `.io` when
    /// Redis cannot be reached or does not answer in time, `.other` when it refuses the
    /// password or the database number.
    init(endpoint: RedisEndpoint, timeoutMilliseconds: Int) throws(StoreError) {
        self.endpoint = endpoint
        var error = [CChar](repeating: 0, count: 256)
        guard let handle = vs_redis_connect(endpoint.host, Int32(endpoint.port), Int32(timeoutMilliseconds), &error, error.count)
        else {
            throw StoreError(.io, "cannot connect to Redis at \(endpoint.address): \(Self.text(error))")
        }
        self.handle = handle
        if let password = endpoint.password {
            let auth = endpoint.username.map { RedisCommand("AUTH", $0, password) } ?? RedisCommand("AUTH", password)
            if case .error(let message) = try run(auth) {
                throw StoreError(.other, "Redis at \(endpoint.address) refused the password: \(message)")
            }
        }
        if endpoint.database != 0, case .error(let message) = try run(RedisCommand("SELECT", String(endpoint.database))) {
            throw StoreError(.other, "Redis at \(endpoint.address) refused database \(endpoint.database): \(message)")
        }
    }

    deinit {
        vs_redis_free(handle)
    }

    /// Runs one command and returns its reply (a Redis error is a reply, not a throw).
    func run(_ command: RedisCommand) throws(StoreError) -> RedisReply {
        try pipeline([command])[0]
    }

    /// Sends the commands in one write and reads their replies in order: one round trip
    /// for all of them. Throws `.io` if the connection fails; it is unusable afterwards.
    func pipeline(_ commands: [RedisCommand]) throws(StoreError) -> [RedisReply] {
        try send(commands)
        return try receive(commands.count)
    }

    /// Writes the commands without waiting for their replies: several connections' commands
    /// are then in flight together, and `receive` collects each one's replies (the sharded
    /// store's batch, one script per instance, costs one round trip, not one per instance).
    /// Throws `.io` if the connection fails; it is unusable afterwards.
    func send(_ commands: [RedisCommand]) throws(StoreError) {
        for command in commands {
            let queued = command.data.withUnsafeBufferPointer { data in
                command.lengths.withUnsafeBufferPointer { lengths in
                    vs_redis_append(handle, data.baseAddress, lengths.baseAddress, Int32(command.count))
                }
            }
            guard queued == 1 else { throw StoreError(.other, "out of memory queueing a Redis command") }
        }
        guard vs_redis_flush(handle) == 1 else { throw failure() }
    }

    /// Reads the next `count` replies, in the order their commands were sent.
    func receive(_ count: Int) throws(StoreError) -> [RedisReply] {
        var replies: [RedisReply] = []
        replies.reserveCapacity(count)
        for _ in 0..<count {
            guard let reply = vs_redis_read(handle) else { throw failure() }
            defer { vs_redis_reply_free(reply) }
            replies.append(RedisReply(copying: reply))
        }
        return replies
    }

    /// Pages through a cursor command (`SCAN`, `SSCAN`: `arguments` without the cursor,
    /// which goes at `cursorIndex`) until the cursor comes back to 0, handing `body` each
    /// element of each page until it returns false. A reply that is not a page (a Redis
    /// error among them) throws `malformed(reply)`. Elements may come twice (Redis's
    /// guarantee for a keyspace that changes meanwhile).
    func scan(
        _ arguments: [String], cursorAt cursorIndex: Int, malformed: (RedisReply) -> StoreError,
        _ body: (RedisReply) throws(StoreError) -> Bool
    ) throws(StoreError) {
        var cursor = "0"
        repeat {
            var command = RedisCommand()
            for (index, argument) in arguments.enumerated() {
                if index == cursorIndex { command.append(cursor) }
                command.append(argument)
            }
            if cursorIndex == arguments.count { command.append(cursor) }
            let reply = try run(command)
            guard case .array(let page) = reply, page.count == 2, let next = page[0].text, case .array(let elements) = page[1]
            else { throw malformed(reply) }
            for element in elements where try !body(element) { return }
            cursor = next
        } while cursor != "0"
    }

    /// Why the connection failed, as an `.io` error.
    private func failure() -> StoreError {
        var text = [CChar](repeating: 0, count: 256)
        vs_redis_describe_failure(handle, &text, text.count)
        return StoreError(.io, "Redis at \(endpoint.address): \(Self.text(text))")
    }

    /// A NUL-terminated C buffer as text.
    static func text(_ buffer: [CChar]) -> String {
        String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}

extension RedisReply {
    /// A copy of hiredis's reply tree (which hiredis frees after the call that handed it over).
    init(copying reply: OpaquePointer) {
        func bytes() -> [UInt8] {
            var length = 0
            guard let start = vs_redis_reply_bytes(reply, &length) else { return [] }
            return Array(UnsafeBufferPointer(start: start, count: length))
        }
        switch vs_redis_reply_type(reply) {
        case VS_REDIS_REPLY_STRING: self = .string(bytes())
        case VS_REDIS_REPLY_STATUS: self = .status(String(decoding: bytes(), as: UTF8.self))
        case VS_REDIS_REPLY_ERROR: self = .error(String(decoding: bytes(), as: UTF8.self))
        case VS_REDIS_REPLY_INTEGER: self = .integer(Int64(vs_redis_reply_integer(reply)))
        case VS_REDIS_REPLY_ARRAY:
            self = .array((0..<vs_redis_reply_count(reply)).map { vs_redis_reply_element(reply, $0).map(RedisReply.init(copying:)) ?? .null })
        default: self = .null
        }
    }
}
