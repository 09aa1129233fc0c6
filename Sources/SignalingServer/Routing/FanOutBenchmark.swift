import SignalingProtocol
import SignalingSupport

/// How long the routing core holds a shard's lock for a message to a user with many
/// devices, measured on the real `Switchboard` (its lock, its steps) without sockets:
/// what `Tools/routing-bench` prints (docs/LOAD-TESTING.md, "Fan-out holds"). Public
/// for that executable only; the server never calls it.
public enum FanOutBenchmark {
    /// The server's chunk (`SwitchboardState.fanOutChunk`).
    public static let defaultChunk = SwitchboardState.fanOutChunk

    public struct Figures: Sendable {
        public let devices: Int
        public let chunk: Int
        public let messages: Int
        /// Holds of the recipient's shard per message (the sender's first hold included).
        public let holdsPerMessage: Double
        /// The longest single hold, and the mean of each message's longest, in ns.
        public let longestHold: UInt64
        public let meanLongestHold: Double
        /// Time in holds per message and per device (ns).
        public let nanosecondsPerDevice: Double
    }

    /// Sends `messages` messages to a user with `devices` connected devices, `chunk`
    /// devices a hold (`Int.max`: the whole fan-out in one hold), each device acknowledging
    /// between messages (not timed), and times every hold of the message itself.
    /// `journaling`: as with a store (every hold builds its commit unit: the store changes
    /// of the copies; no writer takes them, so no commit is timed).
    public static func run(devices: Int, chunk: Int, messages: Int, journaling: Bool = false) -> Figures {
        let switchboard = Switchboard.forBenchmark(journaling: journaling) { $0.fanOutChunk = chunk }
        let now = Instant(nanoseconds: 1_000_000_000)
        func connection(_ slot: Int) -> ConnectionRef { ConnectionRef(loop: 0, slot: UInt32(slot), generation: 1) }
        func attach(_ user: String, _ device: String, slot: Int) -> DeviceRecord {
            switchboard.withState(of: user, wall: 0) { board in
                var effects: [SwitchboardEffect] = []
                return try! board.attach(userID: user, deviceID: device, resume: nil, connection: connection(slot), now: now,
                    into: &effects)
                    .get().record
            }
        }
        let sender = attach("sender", "d", slot: 0)
        let recipients = (0..<devices).map { attach("fan", "d\($0)", slot: $0 + 1) }
        var holds = HoldTimes()
        for number in 0..<messages {
            let message = OutgoingMessage(messageID: "m\(number)", recipient: "fan", contentType: "text/plain", body: [UInt8](repeating: 1, count: 64))
            holds.startOperation()
            let handOff = holds.timed {
                switchboard.withState(of: "sender", wall: 0) { board -> [ShardStep] in
                    var effects: [SwitchboardEffect] = []  // wakes of connections that do not exist
                    let acceptance = try! board.send(message, from: sender, now: now, into: &effects).get()
                    return acceptance.handOff.map { [$0] } ?? []
                }
            }
            holds.run(handOff, on: switchboard, now: now)
            let receipts = switchboard.withState(of: "fan", wall: 0) { board -> [ShardStep] in
                var next: [ShardStep] = []
                var effects: [SwitchboardEffect] = []
                for (index, device) in recipients.enumerated() {
                    next += board.ack(device, connection: connection(index + 1), through: device.lastSeq, into: &effects).next
                }
                return next
            }
            _ = switchboard.run(receipts, chain: StepChain(now: now, wall: 0, requester: nil, group: nil))
            let rest = switchboard.withState(of: "sender", wall: 0) { board -> [ShardStep] in
                var effects: [SwitchboardEffect] = []
                return board.ack(sender, connection: connection(0), through: sender.lastSeq, into: &effects).next
            }
            // An acknowledgement in chunks.
            _ = switchboard.run(rest, chain: StepChain(now: now, wall: 0, requester: nil, group: nil))
        }
        return Figures(
            devices: devices, chunk: chunk, messages: messages, holdsPerMessage: Double(holds.count) / Double(messages),
            longestHold: holds.longest, meanLongestHold: holds.meanLongest,
            nanosecondsPerDevice: Double(holds.total) / Double(messages) / Double(devices))
    }
}

extension Switchboard {
    /// A switchboard for the routing benchmarks: queues and sender shares large enough
    /// that no benchmark operation is refused for room, `configure` for the rest.
    static func forBenchmark(
        journaling: Bool, shardCount: Int = 1, _ configure: (inout SwitchboardConfiguration) -> Void = { _ in }
    ) -> Switchboard {
        var configuration = SwitchboardConfiguration()
        configuration.maxPendingEvents = 1_000_000
        configuration.maxPendingPerSender = 1_000_000
        configure(&configuration)
        return Switchboard(configuration: configuration, epoch: Instant(nanoseconds: 1), journaling: journaling, shardCount: shardCount)
    }
}

/// The holds of a benchmark's operations, each timed as a whole (the lock round included):
/// the longest of all, the mean of each operation's longest, and their total.
struct HoldTimes {
    private(set) var count = 0
    private(set) var total: UInt64 = 0
    private(set) var longest: UInt64 = 0
    private var sumOfLongest: UInt64 = 0
    private(set) var operations = 0
    private var operationLongest: UInt64 = 0

    /// The mean over operations of each one's longest hold (ns).
    var meanLongest: Double { operations == 0 ? 0 : Double(sumOfLongest + operationLongest) / Double(operations) }

    /// The holds from here on belong to the next operation.
    mutating func startOperation() {
        sumOfLongest += operationLongest
        operationLongest = 0
        operations += 1
    }

    mutating func timed<T>(_ body: () -> T) -> T {
        let start = LoopMetrics.now()
        let result = body()
        let elapsed = LoopMetrics.now() &- start
        operationLongest = max(operationLongest, elapsed)
        longest = max(longest, elapsed)
        total &+= elapsed
        count += 1
        return result
    }

    /// Runs `steps` and those they hand on, one timed hold each, in the order
    /// `Switchboard.run` takes them (first in, first out); stops before the first step for
    /// which `stop` is true, and returns it with those after it (not run).
    @discardableResult
    mutating func run(
        _ steps: [ShardStep], on switchboard: Switchboard, now: Instant, stoppingAt stop: (ShardStep) -> Bool = { _ in false }
    ) -> [ShardStep] {
        var pending = FIFOQueue<ShardStep>()
        for step in steps { pending.push(step) }
        while let step = pending.first {
            if stop(step) {
                var rest: [ShardStep] = []
                while let left = pending.pop() { rest.append(left) }
                return rest
            }
            _ = pending.pop()
            let next = timed {
                switchboard.withState(of: step.user, wall: 0) { board -> [ShardStep] in
                    var effects: [SwitchboardEffect] = []
                    return board.handle(step, now: now, into: &effects).next
                }
            }
            for step in next { pending.push(step) }
        }
        return []
    }
}
