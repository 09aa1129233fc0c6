// sqlite-store-bench: how many StoreChanges per second the SQLite store applies when the
// server's writer thread batches them (group commit). Build it in release mode:
//
//   swift build -c release --product sqlite-store-bench
//   .build/release/sqlite-store-bench --seconds 5 --batch-size 2000
//
// Each batch is half appendEvent (round-robin over the devices) and half acknowledge
// (each device acknowledges the event it got in the previous round), so the store stays
// at about one pending event per device, as a healthy server's would.
import SignalingProtocol
import SignalingStore
import SignalingStoreSQLite
import SignalingSupport
#if canImport(Glibc)
import Glibc
#endif

let parser = CommandLineParser(
    command: "sqlite-store-bench",
    usage: "sqlite-store-bench [options]",
    summary: "Measures the SQLite store's apply throughput with group-committed batches.",
    options: [
        OptionSpec("dir", value: "PATH", default: "a new temporary directory, removed afterwards",
                   help: "Data directory (an existing store there is used as is)."),
        OptionSpec("devices", value: "N", default: "10000", help: "Devices the events are spread over."),
        OptionSpec("batch-size", value: "N", default: "2000", help: "Changes per apply (half appends, half acknowledgements)."),
        OptionSpec("body-bytes", value: "N", default: "200", help: "Size of each event body."),
        OptionSpec("seconds", value: "S", default: "5", help: "How long to run."),
        OptionSpec("synchronous", value: "normal|full", default: "normal", help: "Durability setting."),
    ])

@MainActor func fail(_ message: String) -> Never {
    StandardStreams.error("sqlite-store-bench: \(message)\nTry 'sqlite-store-bench --help'.\n")
    exit(64)
}

let options: ParsedOptions
let deviceCount: Int, batchSize: Int, bodyBytes: Int, seconds: Double
let synchronous: SQLiteStoreConfiguration.Synchronous
do {
    options = try parser.parse(Array(CommandLine.arguments.dropFirst()))
    if options.helpRequested {
        StandardStreams.output(parser.helpText)
        exit(0)
    }
    if options.versionRequested {
        StandardStreams.output(ProductVersion.line(for: "sqlite-store-bench"))
        exit(0)
    }
    guard options.positionals.isEmpty else { throw UsageError("unexpected argument '\(options.positionals[0])'") }
    deviceCount = try options.int("devices", in: 1...10_000_000) ?? 10_000
    batchSize = try options.int("batch-size", in: 2...10_000_000) ?? 2_000
    bodyBytes = try options.int("body-bytes", in: 0...65_536) ?? 200
    seconds = try options.double("seconds", in: 0.1...3_600) ?? 5
    guard let parsed = SQLiteStoreConfiguration.Synchronous(rawValue: options.string("synchronous") ?? "normal") else {
        throw UsageError("--synchronous must be normal or full")
    }
    synchronous = parsed
} catch {
    fail("\(error)")
}

// A temporary directory unless one was given; only the store's own files are removed.
let temporary = options.string("dir") == nil
var directory = options.string("dir") ?? ""
if temporary {
    var template = Array("/tmp/sqlite-store-bench-XXXXXX".utf8CString)
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

let store: SQLiteEventStore
do {
    store = try SQLiteEventStore(configuration: SQLiteStoreConfiguration(directory: directory, synchronous: synchronous))
} catch {
    removeTemporaryStore()
    fail("\(error)")
}

let devices = (0..<deviceCount).map { (user: "user\($0)", device: "phone") }
var lastSeq = [UInt64](repeating: 0, count: deviceCount)
let body = [UInt8](repeating: 0x61, count: bodyBytes)
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

// The devices, in batches of the same size.
var setup: [StoreChange] = []
for (index, device) in devices.enumerated() {
    setup.append(.upsertDevice(user: device.user, device: device.device, sessionID: SessionID(high: 1, low: UInt64(index)), lastSeen: clock.wallMilliseconds()))
    if setup.count == batchSize { run(setup); setup.removeAll(keepingCapacity: true) }
}
if !setup.isEmpty { run(setup) }

var latencies: [Duration] = []
var appends = 0, acknowledgements = 0
var nextDevice = 0
let start = clock.now()
let end = start + .milliseconds(Int64(seconds * 1000))
var batch: [StoreChange] = []
batch.reserveCapacity(batchSize)
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
        batch.append(.appendEvent(user: device.user, device: device.device, event: StoredEvent(
            seq: lastSeq[index], type: FrameType.message.rawValue, body: body, createdAt: clock.wallMilliseconds())))
        appends += 1
    }
    let before = clock.now()
    run(batch)
    latencies.append(clock.now() - before)
}
let elapsed = (clock.now() - start).seconds
store.close()
removeTemporaryStore()

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
let changes = appends + acknowledgements
StandardStreams.output("""
    synchronous=\(synchronous.rawValue) devices=\(deviceCount) batch-size=\(batchSize) body-bytes=\(bodyBytes)
    batches: \(latencies.count) in \(decimal(elapsed)) s (\(Int(Double(latencies.count) / elapsed))/s)
    changes/s: \(Int(Double(changes) / elapsed)) (appendEvent \(Int(Double(appends) / elapsed))/s, acknowledge \(Int(Double(acknowledgements) / elapsed))/s)
    apply latency ms: p50 \(percentile(0.5)) p99 \(percentile(0.99)) max \(percentile(1))

    """)
