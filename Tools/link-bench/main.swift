// link-bench: what the node link over Redis pub/sub (RedisNodeLink) carries, and what it
// costs Redis. Two links in this process on one Redis database:
//
//   swift build -c release --product link-bench
//   .build/release/link-bench --redis redis://127.0.0.1:6379/15 --packets 200000 --bytes 200 --threads 4
//
// Throughput: THREADS threads send PACKETS packets of BYTES bytes from one link to the
// other as fast as `send` returns; it prints packets per second from the first send to
// the last delivery, and the commands and bytes each packet cost (the links' counters,
// and Redis's INFO before and after). Latency: then ROUNDS packets go back and forth one
// at a time (each side sends the next when it hears one), and it prints the round trip's
// percentiles: two PUBLISHes and two deliveries each. With --handoff every packet is
// handed to another thread and the next one sent from there, as in a node (link thread
// -> loop -> link thread): the difference is what four thread hand-offs cost.
import Dispatch
import SignalingStore
import SignalingStoreRedis
import SignalingSupport
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

let parser = CommandLineParser(
    command: "link-bench",
    usage: "link-bench --redis redis://HOST:PORT[/DB] [options]",
    summary: "Measures the Redis node link's throughput and round trip.",
    options: [
        OptionSpec("redis", value: "redis://HOST:PORT[/DB]", help: "The Redis to publish through (it writes two presence keys there)."),
        OptionSpec("packets", value: "N", default: "100000", help: "Packets for the throughput run."),
        OptionSpec("bytes", value: "N", default: "200", help: "Size of each packet."),
        OptionSpec("threads", value: "N", default: "4", help: "Sending threads."),
        OptionSpec("rounds", value: "N", default: "2000", help: "Round trips for the latency run."),
        OptionSpec("handoff", help: "In the latency run, hand each packet to another thread and send the next from there, as a node's loops do (the link's thread wakes a loop, a loop wakes the link's thread): the round trip then has the server's four thread hand-offs besides the two PUBLISHes."),
    ])

@MainActor func fail(_ message: String) -> Never {
    StandardStreams.error("link-bench: \(message)\nTry 'link-bench --help'.\n")
    exit(64)
}

let endpoint: RedisEndpoint
let packetCount: Int, packetBytes: Int, threadCount: Int, rounds: Int, handoff: Bool
do {
    let options = try parser.parse(Array(CommandLine.arguments.dropFirst()))
    if options.helpRequested {
        StandardStreams.output(parser.helpText)
        exit(0)
    }
    guard let url = options.string("redis") else { throw UsageError("--redis is required") }
    endpoint = try RedisEndpoint(url: url)
    packetCount = try options.int("packets", in: 1...100_000_000) ?? 100_000
    packetBytes = try options.int("bytes", in: 8...1_000_000) ?? 200
    threadCount = try options.int("threads", in: 1...64) ?? 4
    rounds = try options.int("rounds", in: 0...10_000_000) ?? 2_000
    handoff = options.flag("handoff")
} catch {
    fail("\(error)")
}

/// Counts events and lets the main thread wait for a count (a semaphore per milestone).
final class Receiver: Sendable {
    let packets = Atomic<Int>(0)
    let ups = Atomic<Int>(0)
    let target = Atomic<Int>(Int.max)
    let reached = DispatchSemaphore(value: 0)
    let upSemaphore = DispatchSemaphore(value: 0)

    func handle(_ event: NodeLinkEvent) {
        switch event {
        case .packet:
            if packets.add(1, ordering: .relaxed).newValue == target.load(ordering: .relaxed) { reached.signal() }
        case .up:
            ups.add(1, ordering: .relaxed)
            upSemaphore.signal()
        case .down(let reason):
            StandardStreams.error("link-bench: the link went down: \(reason)\n")
        default:
            break
        }
    }
}

let clock = SystemClock()
let sender: RedisNodeLink, receiver: RedisNodeLink
do {
    sender = try RedisNodeLink(endpoint: endpoint, presenceTTL: .seconds(10), logger: .silent)
    receiver = try RedisNodeLink(endpoint: endpoint, presenceTTL: .seconds(10), logger: .silent)
} catch {
    fail("\(error)")
}
let sent = Receiver(), received = Receiver()
sender.start(sent.handle)
receiver.start(received.handle)
for side in [sent, received] {
    guard side.upSemaphore.wait(timeout: .now() + 10) == .success else { fail("the link did not come up within 10 s") }
}

let before = try? RedisInfo.read(endpoint, section: "stats")
received.target.store(packetCount, ordering: .relaxed)
let start = clock.now()
let threads = (0..<threadCount).map { index in
    JoinableThread(name: "sender-\(index)") {
        let packet = [UInt8](repeating: UInt8(index), count: packetBytes)
        for _ in stride(from: index, to: packetCount, by: threadCount) { sender.send(packet, to: receiver.nodeID) }
    }
}
for thread in threads { thread.join() }
let queued = clock.now() - start
if received.reached.wait(timeout: .now() + 120) != .success {
    StandardStreams.error("link-bench: \(received.packets.load(ordering: .relaxed)) of \(packetCount) packets arrived within 120 s\n")
}
let elapsed = clock.now() - start
let after = try? RedisInfo.read(endpoint, section: "stats")
let out = sender.statistics(), into = receiver.statistics()
func stat(_ info: [String: String]?, _ name: String) -> Int { Int(info?[name] ?? "") ?? 0 }
let redisCommands = stat(after, "total_commands_processed") - stat(before, "total_commands_processed")
let redisIn = stat(after, "total_net_input_bytes") - stat(before, "total_net_input_bytes")
let redisOut = stat(after, "total_net_output_bytes") - stat(before, "total_net_output_bytes")
func rate(_ value: Double) -> String { String(Int(value.rounded())) }
func per(_ value: Int) -> String { String((Double(value) / Double(packetCount) * 100).rounded() / 100) }
StandardStreams.output("""
    redis=\(endpoint.redacted) packets=\(packetCount) bytes=\(packetBytes) threads=\(threadCount)
    throughput: \(rate(Double(packetCount) / elapsed.seconds)) packets/s (\(into.packetsIn) delivered in \(rate(elapsed.seconds * 1000)) ms; send calls returned after \(rate(queued.seconds * 1000)) ms)
    per packet: link commands \(per(out.commandsSent + into.commandsSent)), Redis commands \(per(redisCommands)), Redis bytes in \(per(redisIn)), out \(per(redisOut)) (payload \(packetBytes))

    """)

// Round trips: each side answers what it hears with the next packet.
if rounds > 0 {
    final class PingPong: Sendable {
        let times = Mutex<[Duration]>([])
        let sentAt = Mutex<Instant>(Instant(nanoseconds: 0))
        let done = DispatchSemaphore(value: 0)
    }
    let game = PingPong()
    let a = try! RedisNodeLink(endpoint: endpoint, presenceTTL: .seconds(10), logger: .silent)
    let b = try! RedisNodeLink(endpoint: endpoint, presenceTTL: .seconds(10), logger: .silent)
    let upA = DispatchSemaphore(value: 0), upB = DispatchSemaphore(value: 0)
    let packet = [UInt8](repeating: 1, count: packetBytes)
    // --handoff: a "loop" per side, a thread that sleeps until the link's thread hands it
    // a packet (as a node's loops sleep in epoll on their eventfd), and sends from there.
    let loopA = handoff ? HandoffThread(name: "loop-a") : nil, loopB = handoff ? HandoffThread(name: "loop-b") : nil
    @Sendable func answer() {
        let now = SystemClock().now()
        let count = game.times.withLock { times in
            times.append(now - game.sentAt.withLock { $0 })
            return times.count
        }
        if count == rounds {
            game.done.signal()
        } else {
            game.sentAt.withLock { $0 = now }
            a.send(packet, to: b.nodeID)
        }
    }
    b.start { event in
        if case .packet(let bytes) = event {
            if let loopB { loopB.run { b.send(bytes, to: a.nodeID) } } else { b.send(bytes, to: a.nodeID) }
        } else if event == .up {
            upB.signal()
        }
    }
    a.start { event in
        guard case .packet = event else {
            if event == .up { upA.signal() }
            return
        }
        if let loopA { loopA.run { answer() } } else { answer() }
    }
    _ = upA.wait(timeout: .now() + 10)
    _ = upB.wait(timeout: .now() + 10)
    game.sentAt.withLock { $0 = SystemClock().now() }
    a.send(packet, to: b.nodeID)
    if game.done.wait(timeout: .now() + 120) != .success { StandardStreams.error("link-bench: the round trips did not finish within 120 s\n") }
    let times = game.times.withLock { $0 }.sorted()
    func percentile(_ p: Double) -> String {
        guard !times.isEmpty else { return "-" }
        return String(Int((times[min(times.count - 1, Int(Double(times.count) * p))].seconds * 1_000_000).rounded()))
    }
    loopA?.stop()
    loopB?.stop()
    StandardStreams.output("round trip (\(times.count) rounds\(handoff ? ", 4 thread hand-offs" : "")): p50 \(percentile(0.5)) µs, p99 \(percentile(0.99)) µs, max \(percentile(1.0)) µs\n")
    a.stop()
    b.stop()
}
sender.stop()
receiver.stop()

/// A thread that runs closures handed to it, sleeping in between (a node's loop, for
/// --handoff): each `run` from another thread is one wake-up of a sleeping thread.
final class HandoffThread: Sendable {
    private let work = Mutex<[@Sendable () -> Void]>([])
    private let stopped = Atomic<Bool>(false)
    private let wake = DispatchSemaphore(value: 0)
    private let thread = Mutex<JoinableThread?>(nil)

    init(name: String) {
        let thread = JoinableThread(name: name) { [self] in
            while !stopped.load(ordering: .acquiring) {
                wake.wait()
                for job in work.withLock({ jobs in defer { jobs = [] }; return jobs }) { job() }
            }
        }
        self.thread.withLock { $0 = thread }
    }

    func run(_ job: @escaping @Sendable () -> Void) {
        work.withLock { $0.append(job) }
        wake.signal()
    }

    func stop() {
        stopped.store(true, ordering: .releasing)
        wake.signal()
        thread.withLock { $0 }?.join()
    }
}
