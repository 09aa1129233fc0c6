// connect-cycles: connects devices to a running voipserver over and over (connect, HELLO
// with the device's resume point, WELCOME, close) and prints the server's resident memory
// as it goes, so that memory kept per connect/disconnect cycle shows up as growth.
// Run by Tools/bench-connect-cycles, which builds and starts a release server for it.
import CLinuxShims
import SignalingProtocol
import SignalingSupport
import Synchronization
import VoipLoadKit
#if canImport(Glibc)
import Glibc
#endif

struct Options {
    var port: UInt16 = 0
    var serverPID: Int32 = 0
    var cycles = 100_000
    var warmupSeconds = 25
    var devices = 2_000
    var threads = 4
    var sourceAddresses = 64
    var samples = 10
    /// Cycles per second over all threads (0: as fast as the server answers).
    var rate = 2_000
}

func usage(_ message: String) -> Never {
    StandardStreams.error("connect-cycles: \(message)\n")
    StandardStreams.error("""
        usage: connect-cycles --port PORT --server-pid PID [--cycles N] [--warmup-seconds S] [--devices N]
                              [--threads N] [--source-addresses N] [--samples N] [--rate N]

        """)
    exit(64)
}

func parse(_ arguments: [String]) -> Options {
    var options = Options()
    var index = 0
    func value() -> Int {
        index += 1
        guard index < arguments.count, let number = Int(arguments[index]), number >= 0 else {
            usage("\(arguments[index - 1]) needs a number")
        }
        return number
    }
    while index < arguments.count {
        switch arguments[index] {
        case "--port": options.port = UInt16(clamping: value())
        case "--server-pid": options.serverPID = Int32(clamping: value())
        case "--cycles": options.cycles = value()
        case "--warmup-seconds": options.warmupSeconds = value()
        case "--devices": options.devices = max(1, value())
        case "--threads": options.threads = max(1, value())
        case "--source-addresses": options.sourceAddresses = min(250, max(1, value()))
        case "--samples": options.samples = max(1, value())
        case "--rate": options.rate = value()
        default: usage("unknown argument \(arguments[index])")
        }
        index += 1
    }
    guard options.port != 0, options.serverPID > 0 else { usage("--port and --server-pid are required") }
    guard options.cycles > 0 else { usage("--cycles must be positive") }
    return options
}

struct CycleFailure: Error { let reason: String }

/// One device's identity and resume point, kept by the thread that cycles it.
struct Device {
    let userID: String
    var resume: ResumePoint?
}

/// Connect from `source` (127.0.0.x), HELLO, wait for WELCOME, close. Returns the resume
/// point for the next cycle.
func cycle(_ device: Device, port: UInt16, source: UInt32, buffer: inout [UInt8]) throws(CycleFailure) -> ResumePoint {
    let fd: Int32
    do throws(SystemError) {
        fd = try SocketCalls.openTCP(nonBlocking: false)
    } catch {
        throw CycleFailure(reason: error.description)
    }
    defer { close(fd) }
    voipload_prepare_client_socket(fd)
    do throws(SystemError) {
        try SocketCalls.bind(fd, SocketCalls.socketAddress(source, port: 0))
        _ = try SocketCalls.connect(fd, SocketCalls.socketAddress(0x7F00_0001, port: port))
        let hello = FrameEncoder.encode(.hello(Hello(userID: device.userID, deviceID: "p", resume: device.resume)))
        try hello.withUnsafeBytes { bytes in Result { () throws(SystemError) in try SocketCalls.sendAll(fd, bytes) } }.get()
        try SocketCalls.setOption(fd, level: SOL_SOCKET, name: SO_RCVTIMEO, timeval(tv_sec: 10, tv_usec: 0))
    } catch {
        throw CycleFailure(reason: error.description)
    }
    var assembler = FrameAssembler()
    while true {
        let count: Int
        switch buffer.withUnsafeMutableBytes({ SocketCalls.receive(fd, into: $0) }) {
        case .transferred(let moved) where moved > 0: count = moved
        case .transferred: throw CycleFailure(reason: "closed before WELCOME")
        case .wouldBlock: throw CycleFailure(reason: "no WELCOME within 10 s")
        case .failed(let code): throw CycleFailure(reason: SystemError("recv", code).description)
        }
        let frames: [Frame]
        do {
            frames = try buffer.withUnsafeBytes { bytes in try assembler.drain(UnsafeRawBufferPointer(rebasing: bytes[..<count])) }
        } catch {
            throw CycleFailure(reason: "undecodable frame: \(error)")
        }
        for frame in frames {
            switch frame {
            case .welcome(let welcome): return ResumePoint(sessionID: welcome.sessionID, lastReceivedSeq: welcome.ackedSeq)
            case .close(let close): throw CycleFailure(reason: "refused: \(close.code) \(close.message)")
            default: continue
            }
        }
    }
}

let options = parse(Array(CommandLine.arguments.dropFirst()))
let completed = Atomic<Int>(0)
let failures = Atomic<Int>(0)
let firstFailure = Mutex<String?>(nil)

func residentKiB() -> UInt64 { (ProcessStats.residentBytes(pid: options.serverPID) ?? 0) / 1024 }
/// VmRSS split as the kernel counts it: anonymous (the heap), file-backed (the binary,
/// libraries, SQLite's mapped files) and shared memory.
func residentParts() -> String {
    guard let status = ProcessStats.readFile("/proc/\(options.serverPID)/status") else { return "" }
    let parts = status.split(separator: "\n").filter { $0.hasPrefix("RssAnon:") || $0.hasPrefix("RssFile:") || $0.hasPrefix("RssShmem:") }
    return parts.map { $0.split(whereSeparator: { $0 == " " || $0 == "\t" }).dropLast().joined(separator: " ") }.joined(separator: ", ")
}
func openDescriptors() -> Int {
    var count = 0
    guard let directory = opendir("/proc/\(options.serverPID)/fd") else { return -1 }
    defer { closedir(directory) }
    while readdir(directory) != nil { count += 1 }
    return count - 2
}

/// Runs cycles `range` on this thread; thread t owns devices t, t + threads, ... so no
/// device is connected twice at once.
func runCycles(thread: Int, count: Int) {
    var devices = stride(from: thread, to: options.devices, by: options.threads).map { Device(userID: "c\($0)", resume: nil) }
    guard !devices.isEmpty else { return }
    var buffer = [UInt8](repeating: 0, count: 4096)
    var next = 0
    let clock = SystemClock()
    let interval: Duration = options.rate > 0 ? .nanoseconds(Int64(1e9 * Double(options.threads) / Double(options.rate))) : .zero
    var due = clock.now()
    for index in 0..<count {
        if options.rate > 0 {
            clock.sleep(until: due)
            due = due + interval
        }
        let source = UInt32(0x7F00_0002) + UInt32((index * options.threads + thread) % options.sourceAddresses)
        do {
            devices[next].resume = try cycle(devices[next], port: options.port, source: source, buffer: &buffer)
        } catch {
            failures.add(1, ordering: .relaxed)
            firstFailure.withLock { if $0 == nil { $0 = error.reason } }
            devices[next].resume = nil
        }
        completed.add(1, ordering: .relaxed)
        next = (next + 1) % devices.count
    }
}

/// Runs `total` cycles on the worker threads and waits for them.
func runPhase(_ total: Int) {
    var threads: [pthread_t] = []
    for thread in 0..<options.threads {
        let share = total / options.threads + (thread < total % options.threads ? 1 : 0)
        let box = Unmanaged.passRetained(PhaseArgument(thread: thread, count: share)).toOpaque()
        var handle = pthread_t()
        pthread_create(&handle, nil, { argument in
            let phase = Unmanaged<PhaseArgument>.fromOpaque(argument!).takeRetainedValue()
            runCycles(thread: phase.thread, count: phase.count)
            return nil
        }, box)
        threads.append(handle)
    }
    for handle in threads { pthread_join(handle, nil) }
}

final class PhaseArgument {
    let thread: Int
    let count: Int
    init(thread: Int, count: Int) { self.thread = thread; self.count = count }
}

/// Lets the server finish the disconnects of the last cycles before its memory is read.
func settle() { usleep(1_000_000) }

func signed(_ value: Int64) -> String { value >= 0 ? "+\(value)" : "\(value)" }
func oneDecimal(_ value: Double) -> String {
    let tenths = Int64((value * 10).rounded())
    return "\(tenths < 0 ? "-" : "")\(abs(tenths) / 10).\(abs(tenths) % 10)"
}

let clock = SystemClock()
let start = clock.now()
let baseline = residentKiB()
print("server RSS before any connection: \(baseline) KiB, \(openDescriptors()) descriptors")
// The warm-up is time, not cycles: besides a record per device, the server keeps each
// connection's handshake deadline (10 s) in a FIFO whose buffer reaches its steady size,
// about twice the deadlines of one handshake timeout at the current rate, only after
// twice the timeout.
var warmupCycles = 0
while (clock.now() - start).seconds < Double(options.warmupSeconds) {
    runPhase(5_000)
    warmupCycles += 5_000
}
settle()
let afterWarmup = residentKiB()
print("after warm-up (\(options.warmupSeconds) s, \(warmupCycles) cycles): \(afterWarmup) KiB (\(residentParts()) KiB), \(openDescriptors()) descriptors")
let measured = options.cycles
var done = 0
for sample in 1...options.samples {
    let share = measured / options.samples + (sample <= measured % options.samples ? 1 : 0)
    runPhase(share)
    done += share
    settle()
    let rss = residentKiB()
    let growth = Int64(rss) - Int64(afterWarmup)
    print("after \(done) more cycles: \(rss) KiB (\(signed(growth)) KiB since warm-up, \(oneDecimal(Double(growth * 1024) / Double(done))) B per cycle; \(residentParts()) KiB)")
}
let end = residentKiB()
let seconds = (clock.now() - start).seconds
let growth = Int64(end) - Int64(afterWarmup)
let total = completed.load(ordering: .relaxed)
print("\(total) cycles in \(oneDecimal(seconds)) s (\(Int(Double(total) / seconds))/s), \(failures.load(ordering: .relaxed)) failed; \(openDescriptors()) descriptors open at the end")
if let reason = firstFailure.withLock({ $0 }) { print("first failure: \(reason)") }
print("RSS growth after warm-up: \(signed(growth)) KiB over \(measured) cycles (\(oneDecimal(Double(growth * 1024) / Double(measured))) B per cycle): \(growth <= 1024 ? "FLAT (within 1 MiB)" : "GROWS")")
exit(failures.load(ordering: .relaxed) == 0 && growth <= 1024 ? 0 : 1)
