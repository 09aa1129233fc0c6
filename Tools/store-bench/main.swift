// store-bench: how many StoreChanges per second a store (SQLite, or Redis) applies when
// the server's writer thread batches them (group commit). Build it in release mode:
//
//   swift build -c release --product store-bench
//   .build/release/store-bench --seconds 5 --batch-size 2000
//   .build/release/store-bench --store redis://127.0.0.1:6379/15 --message-ids
//
// Each batch is half appendEvent (round-robin over the devices) and half acknowledge
// (each device acknowledges the event it got in the previous round), so the store stays
// at about one pending event per device, as a healthy server's would. With --message-ids
// every event is a message: its sender's id is remembered beside it (and the id of 10,000
// messages before forgotten), as the server does. With Redis it also prints what each
// event cost Redis, from INFO before and after the run (start that Redis with
// --auto-aof-rewrite-percentage 0: a rewrite during the run would shrink the AOF).
//
// With --messages-per-commit M it replays instead what the server's writer commits for
// 1:1 messages to random idle devices (Tools/bench-reference): per message a sequence
// reservation when the recipient's window is used up, the event, its id remembered, the
// recipient's acknowledgement, the receipt to the sender's device and the sender's
// acknowledgement; M messages per commit, compacted (StoreBatch) as the writer does. It
// prints the writer's CPU per message (thread CPU time, compaction included), which other
// work on the machine changes far less than it changes latencies, and the bytes it wrote
// per message (WAL frames and checkpoints: what the disk gets). Message ids are random
// (--message-id-style random: UUIDs, as apps send them) or a counter, and --retained-ids
// of them are kept, the oldest forgotten as each new one is remembered, as the server's
// --dedup-capacity does once it is full (the store starts with that many).
import SignalingProtocol
import SignalingStore
import SignalingStoreRedis
import SignalingStoreSQLite
import SignalingSupport
#if canImport(Glibc)
import Glibc
#endif

let parser = CommandLineParser(
    command: "store-bench",
    usage: "store-bench [options]",
    summary: "Measures a store's apply throughput with group-committed batches.",
    options: [
        OptionSpec("store", value: "sqlite|redis://HOST:PORT[/DB]", default: "sqlite",
                   help: "The store to measure. Give Redis an empty database of its own: the run writes into it."),
        OptionSpec("dir", value: "PATH", default: "a new temporary directory, removed afterwards",
                   help: "SQLite: data directory (an existing store there is used as is)."),
        OptionSpec("devices", value: "N", default: "10000", help: "Devices the events are spread over."),
        OptionSpec("batch-size", value: "N", default: "2000", help: "Changes per apply (half appends, half acknowledgements)."),
        OptionSpec("body-bytes", value: "N", default: "200", help: "Size of each event body."),
        OptionSpec("seconds", value: "S", default: "5", help: "How long to run."),
        OptionSpec("synchronous", value: "normal|full", default: "normal", help: "SQLite: durability setting."),
        OptionSpec("message-ids", help: "Remember a message id with every event (and forget an old one), as for messages."),
        OptionSpec("messages-per-commit", value: "M",
                   help: "Replay the server's changes for 1:1 messages to random devices instead, M messages per commit (closed loop at 15,000 devices: about 40; 1000/s: 2)."),
        OptionSpec("message-id-style", value: "random|sequential", default: "random",
                   help: "With --messages-per-commit: message ids as apps make them (random UUIDs), or a counter (as Tools/reference-probe does)."),
        OptionSpec("retained-ids", value: "N", default: "100000",
                   help: "With --messages-per-commit: message ids kept (stored before the run; the oldest forgotten for each new one), as a server whose --dedup-capacity is N and full."),
    ])

@MainActor func fail(_ message: String) -> Never {
    StandardStreams.error("store-bench: \(message)\nTry 'store-bench --help'.\n")
    exit(64)
}

let options: ParsedOptions
let deviceCount: Int, batchSize: Int, bodyBytes: Int, seconds: Double, messagesPerCommit: Int?
let randomMessageIDs: Bool, retainedIDs: Int
let synchronous: SQLiteStoreConfiguration.Synchronous
var redisEndpoint: RedisEndpoint?
do {
    options = try parser.parse(Array(CommandLine.arguments.dropFirst()))
    if options.helpRequested {
        StandardStreams.output(parser.helpText)
        exit(0)
    }
    if options.versionRequested {
        StandardStreams.output(ProductVersion.line(for: "store-bench"))
        exit(0)
    }
    guard options.positionals.isEmpty else { throw UsageError("unexpected argument '\(options.positionals[0])'") }
    deviceCount = try options.int("devices", in: 1...10_000_000) ?? 10_000
    batchSize = try options.int("batch-size", in: 2...10_000_000) ?? 2_000
    bodyBytes = try options.int("body-bytes", in: 0...65_536) ?? 200
    seconds = try options.double("seconds", in: 0.1...3_600) ?? 5
    messagesPerCommit = try options.int("messages-per-commit", in: 1...100_000)
    switch options.string("message-id-style") ?? "random" {
    case "random": randomMessageIDs = true
    case "sequential": randomMessageIDs = false
    default: throw UsageError("--message-id-style must be random or sequential")
    }
    retainedIDs = try options.int("retained-ids", in: 1...100_000_000) ?? 100_000
    guard let parsed = SQLiteStoreConfiguration.Synchronous(rawValue: options.string("synchronous") ?? "normal") else {
        throw UsageError("--synchronous must be normal or full")
    }
    synchronous = parsed
    if let store = options.string("store"), store != "sqlite" {
        redisEndpoint = try RedisEndpoint(url: store)
    }
} catch {
    fail("\(error)")
}

// A temporary directory unless one was given; only the store's own files are removed.
let temporary = options.string("dir") == nil && redisEndpoint == nil
var directory = options.string("dir") ?? ""
if temporary {
    var template = Array("/tmp/store-bench-XXXXXX".utf8CString)
    guard let created = mkdtemp(&template) else { fail("cannot create a temporary directory") }
    directory = String(cString: created)
}
@MainActor func removeTemporaryStore() {
    guard temporary else { return }
    let configuration = SQLiteStoreConfiguration(directory: directory)
    for path in [configuration.databasePath, configuration.databasePath + "-wal", configuration.databasePath + "-shm", configuration.lockPath] {
        unlink(path)
    }
    rmdir(directory)
}

let store: any EventStore
var setting = "store=sqlite synchronous=\(synchronous.rawValue)"
do {
    if let redisEndpoint {
        // Whatever Redis runs with is measured; the header says what that was.
        store = try RedisEventStore(configuration: RedisStoreConfiguration(endpoint: redisEndpoint, allowVolatile: true))
        let persistence = try RedisInfo.read(redisEndpoint, section: "persistence")
        setting = "store=\(redisEndpoint.redacted) aof_enabled=\(persistence["aof_enabled"] ?? "?") appendfsync=\(try RedisInfo.config(redisEndpoint, "appendfsync"))"
    } else {
        store = try SQLiteEventStore(configuration: SQLiteStoreConfiguration(directory: directory, synchronous: synchronous))
    }
} catch {
    removeTemporaryStore()
    fail("\(error)")
}

let devices = (0..<deviceCount).map { (user: "user\($0)", device: "phone") }
var lastSeq = [UInt64](repeating: 0, count: deviceCount)
let body = [UInt8](repeating: 0x61, count: bodyBytes)
let withMessageIDs = options.has("message-ids")
let clock = SystemClock()

@MainActor func run(_ batch: [StoreChange]) {
    do {
        try store.apply(batch)
    } catch {
        store.close()
        removeTemporaryStore()
        fail("apply failed: \(error)")
    }
}

/// What Redis has done so far: command calls (those run by the apply script included),
/// bytes received from clients, the AOF's size.
struct RedisCounters {
    var commands = 0, scripts = 0, inputBytes = 0, aofBytes = 0

    init(_ endpoint: RedisEndpoint) throws(StoreError) {
        // INFO and CONFIG are the benchmark's own.
        for (command, calls) in try RedisInfo.commandCalls(endpoint) where !command.hasPrefix("info") && !command.hasPrefix("config") {
            commands += calls
            if command == "evalsha" { scripts = calls }
        }
        inputBytes = Int(try RedisInfo.read(endpoint, section: "stats")["total_net_input_bytes"] ?? "") ?? 0
        aofBytes = Int(try RedisInfo.read(endpoint, section: "persistence")["aof_current_size"] ?? "") ?? 0
    }
}

// The devices, in batches of the same size.
var setup: [StoreChange] = []
for (index, device) in devices.enumerated() {
    setup.append(.upsertDevice(user: device.user, device: device.device, sessionID: SessionID(high: 1, low: UInt64(index)), lastSeen: clock.wallMilliseconds()))
    if setup.count == batchSize { run(setup); setup.removeAll(keepingCapacity: true) }
}
if !setup.isEmpty { run(setup) }

if let messagesPerCommit {
    runMessages(perCommit: messagesPerCommit)
    exit(0)
}

/// Bytes this process has passed to write system calls (`wchar` in /proc/self/io).
func bytesWritten() -> Int {
    let io = readTextFile("/proc/self/io") ?? ""
    guard let line = io.split(separator: "\n").first(where: { $0.hasPrefix("wchar:") }) else { return 0 }
    return Int(line.dropFirst(6).drop(while: { $0 == " " })) ?? 0
}

/// The --messages-per-commit workload (see the top of this file).
@MainActor func runMessages(perCommit: Int) {
    let sender = (user: "sender", device: "p1")
    /// The server reserves 64 numbers ahead of a device's last event (SwitchboardState.reservationWindow),
    /// the first 64 at the handshake: replayed here before the measurement.
    let window: UInt64 = 64
    var reserved = [UInt64](repeating: window, count: deviceCount)
    for start in stride(from: 0, to: deviceCount, by: batchSize) {
        run(devices[start..<min(deviceCount, start + batchSize)].map {
            .reserveSequence(user: $0.user, device: $0.device, through: window)
        })
    }
    var senderSeq: UInt64 = 0, senderReserved: UInt64 = 0
    var random = SystemRandomNumberGenerator()
    let idPrefix = String(clock.wallMilliseconds(), radix: 36)
    var messages = 0, commits = 0
    var cpu: UInt64 = 0
    var batch: [StoreChange] = []
    func threadCPUNanoseconds() -> UInt64 {
        var time = timespec()
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &time)
        return UInt64(time.tv_sec) * 1_000_000_000 + UInt64(time.tv_nsec)
    }
    var idCount = 0
    func nextMessageID() -> String {
        idCount += 1
        guard randomMessageIDs else { return "m\(idPrefix)-\(idCount)" }
        let high = random.next() as UInt64, low = random.next() as UInt64
        let hex = String(high, radix: 16) + String(low, radix: 16)
        return String(repeating: "0", count: 32 - hex.count) + hex
    }
    // The retained ids, oldest first from `oldestRetained` (a ring).
    var retained: [StoredMessageID] = []
    retained.reserveCapacity(retainedIDs)
    var oldestRetained = 0
    // Accepted before the run, a thousand a second, as a server's ids are spread over its
    // de-duplication window.
    let filledFrom = clock.wallMilliseconds() - UInt64(retainedIDs)
    while retained.count < retainedIDs {
        let count = min(batchSize, retainedIDs - retained.count)
        let remembered = (0..<count).map { offset in
            let time = filledFrom + UInt64(retained.count + offset)
            return StoredMessageID(sender: sender.user, messageID: nextMessageID(), serverTime: time, expiresAt: time + 86_400_000)
        }
        retained += remembered
        run(remembered.map { .rememberMessageID($0) })
    }
    let writtenBefore = bytesWritten()
    let pagesBefore = (store as? SQLiteEventStore)?.pagesWritten
    let start = clock.now()
    let end = start + .milliseconds(Int64(seconds * 1000))
    while clock.now() < end {
        batch.removeAll(keepingCapacity: true)
        let now = clock.wallMilliseconds()
        for _ in 0..<perCommit {
            let index = Int.random(in: 0..<deviceCount, using: &random)
            let device = devices[index]
            lastSeq[index] += 1
            let seq = lastSeq[index]
            if seq > reserved[index] {
                reserved[index] = seq + window
                batch.append(.reserveSequence(user: device.user, device: device.device, through: reserved[index]))
            }
            let messageID = nextMessageID()
            batch.append(.appendEvent(user: device.user, device: device.device, event: StoredEvent(
                seq: seq, type: FrameType.message.rawValue, body: body,
                receipt: StoredReceipt(sender: sender.user, messageID: messageID, recipient: device.user), createdAt: now)))
            let remembered = StoredMessageID(sender: sender.user, messageID: messageID, serverTime: now, expiresAt: now + 86_400_000)
            batch.append(.rememberMessageID(remembered))
            let oldest = retained[oldestRetained]
            batch.append(.forgetMessageID(sender: oldest.sender, messageID: oldest.messageID, serverTime: oldest.serverTime))
            retained[oldestRetained] = remembered
            oldestRetained = (oldestRetained + 1) % retained.count
            batch.append(.acknowledge(user: device.user, device: device.device, through: seq))
            senderSeq += 1
            if senderSeq > senderReserved {
                senderReserved = senderSeq + window
                batch.append(.reserveSequence(user: sender.user, device: sender.device, through: senderReserved))
            }
            batch.append(.appendEvent(user: sender.user, device: sender.device, event: StoredEvent(
                seq: senderSeq, type: FrameType.messageDelivered.rawValue, body: Array(body.prefix(48)), createdAt: now)))
            batch.append(.acknowledge(user: sender.user, device: sender.device, through: senderSeq))
            messages += 1
        }
        let before = threadCPUNanoseconds()
        StoreBatch.compact(&batch)
        run(batch)
        cpu += threadCPUNanoseconds() - before
        commits += 1
    }
    let elapsed = (clock.now() - start).seconds
    // The store's checkpoints (its own thread) count too: they are part of what the disk gets.
    let written = bytesWritten() - writtenBefore
    let pages = pagesBefore.map { (store as! SQLiteEventStore).pagesWritten - $0 }
    store.close()
    removeTemporaryStore()
    StandardStreams.output("""
        \(setting) devices=\(deviceCount) messages-per-commit=\(perCommit) body-bytes=\(bodyBytes) \
        message-ids=\(randomMessageIDs ? "random" : "sequential") retained-ids=\(retainedIDs)
        messages: \(messages) in \(commits) commits, \(decimal(elapsed)) s
        writer CPU per message: \(decimal(Double(cpu) / Double(max(1, messages)) / 1000)) µs (compaction and apply, thread CPU time)
        written per message: \(written / max(1, messages)) bytes (write system calls of the whole process: WAL frames, checkpoints)\
        \(pages.map { "; WAL pages per commit: \(decimal(Double($0) / Double(max(1, commits))))" } ?? "")

        """)
}

var before: RedisCounters?
do {
    before = try redisEndpoint.map { endpoint throws(StoreError) in try RedisCounters(endpoint) }
} catch {
    fail("\(error)")
}
var latencies: [Duration] = []
var appends = 0, acknowledgements = 0, messageIDChanges = 0
/// The server times of the last 10,000 ids remembered, by `appends % 10_000`.
var serverTimes = [UInt64](repeating: 0, count: 10_000)
var nextDevice = 0
let start = clock.now()
let end = start + .milliseconds(Int64(seconds * 1000))
var batch: [StoreChange] = []
batch.reserveCapacity(batchSize * 2)
while clock.now() < end {
    batch.removeAll(keepingCapacity: true)
    for _ in 0..<(batchSize / 2) {
        let index = nextDevice
        nextDevice = (nextDevice + 1) % deviceCount
        let device = devices[index]
        if lastSeq[index] > 0 {
            batch.append(.acknowledge(user: device.user, device: device.device, through: lastSeq[index]))
            acknowledgements += 1
        }
        lastSeq[index] += 1
        let now = clock.wallMilliseconds()
        batch.append(.appendEvent(user: device.user, device: device.device, event: StoredEvent(
            seq: lastSeq[index], type: FrameType.message.rawValue, body: body, createdAt: now)))
        appends += 1
        if withMessageIDs {
            // From one of 100 senders; ids are forgotten 10,000 messages later.
            let sender = "sender\(appends % 100)"
            batch.append(.rememberMessageID(StoredMessageID(sender: sender, messageID: "m\(appends)", serverTime: now, expiresAt: now + 86_400_000)))
            // (10,000 is a multiple of 100: the forgotten id was this sender's too.)
            if appends > 10_000 {
                batch.append(.forgetMessageID(sender: sender, messageID: "m\(appends - 10_000)", serverTime: serverTimes[appends % 10_000]))
            }
            serverTimes[appends % 10_000] = now
            messageIDChanges += appends > 10_000 ? 2 : 1
        }
    }
    let started = clock.now()
    run(batch)
    latencies.append(clock.now() - started)
}
let elapsed = (clock.now() - start).seconds
store.close()
removeTemporaryStore()
var after: RedisCounters?
do {
    after = try redisEndpoint.map { endpoint throws(StoreError) in try RedisCounters(endpoint) }
} catch {
    fail("\(error)")
}

latencies.sort()
/// Two decimals without Foundation.
func decimal(_ value: Double) -> String {
    let hundredths = Int((value * 100).rounded())
    let fraction = hundredths % 100
    return "\(hundredths / 100).\(fraction < 10 ? "0" : "")\(fraction)"
}
@MainActor func percentile(_ p: Double) -> String {
    decimal(latencies[min(latencies.count - 1, Int(Double(latencies.count) * p))].seconds * 1000)
}
let changes = appends + acknowledgements + messageIDChanges
var report = """
    \(setting) devices=\(deviceCount) batch-size=\(batchSize) body-bytes=\(bodyBytes) message-ids=\(withMessageIDs)
    batches: \(latencies.count) in \(decimal(elapsed)) s (\(Int(Double(latencies.count) / elapsed))/s)
    changes/s: \(Int(Double(changes) / elapsed)) (appendEvent \(Int(Double(appends) / elapsed))/s, acknowledge \(Int(Double(acknowledgements) / elapsed))/s, message ids \(Int(Double(messageIDChanges) / elapsed))/s)
    apply latency ms: p50 \(percentile(0.5)) p99 \(percentile(0.99)) max \(percentile(1))

    """
if let before, let after, appends > 0 {
    func perEvent(_ value: Int) -> String { decimal(Double(value) / Double(appends)) }
    report += """
        redis per event (its append, acknowledgement\(withMessageIDs ? " and message id" : "")): \
        commands \(perEvent(after.commands - before.commands)) (one script call per \(decimal(Double(appends) / Double(max(1, after.scripts - before.scripts)))) events), \
        bytes received \(perEvent(after.inputBytes - before.inputBytes)), AOF bytes \(perEvent(after.aofBytes - before.aofBytes))

        """
}
StandardStreams.output(report)
