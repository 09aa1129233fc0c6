import SignalingProtocol
import SignalingSupport

/// How long the routing core holds a shard's lock for one large ACK, measured on the real
/// `Switchboard` (two shards, its locks, its steps) without sockets: a device that has
/// `events` messages from a sender of the other shard acknowledges all of them at once,
/// and every hold of the acknowledgement (its chunks, and the receipts' steps on the
/// sender's shard) is timed. What `Tools/routing-bench` prints (docs/LOAD-TESTING.md,
/// "ACK holds"). Public for that executable only; the server never calls it.
public enum AckBenchmark {
    /// The server's chunk (`SwitchboardState.ackChunk`).
    public static let defaultChunk = SwitchboardState.ackChunk

    public struct Figures: Sendable {
        public let events: Int
        public let chunk: Int
        public let rounds: Int
        /// Holds per ACK (the receiving hold, its chunks, the receipts on the sender's shard).
        public let holdsPerAck: Double
        /// The longest single hold, and the mean of each ACK's longest, in ns.
        public let longestHold: UInt64
        public let meanLongestHold: Double
        /// Time in holds per ACK and per event (ns).
        public let nanosecondsPerEvent: Double
    }

    /// `rounds` times: a sender on one shard sends `events` messages to a one-device user
    /// on the other (not timed), whose device then acknowledges all of them in one ACK,
    /// `chunk` events a hold (`Int.max`: the whole ACK in one hold, as before chunks); the
    /// sender's device then acknowledges its receipts (not timed). `journaling`: as with a
    /// store (every hold builds its commit unit; no writer takes them).
    public static func run(events: Int, chunk: Int, rounds: Int, journaling: Bool = false) -> Figures {
        let switchboard = Switchboard.forBenchmark(journaling: journaling, shardCount: 2) { $0.ackChunk = chunk }
        let now = Instant(nanoseconds: 1_000_000_000)
        // Two users on different shards (`ShardMap` is a stable hash).
        let sender = "sender"
        let recipient = (0...).lazy.map { "recipient\($0)" }.first { switchboard.shard(of: $0) != switchboard.shard(of: sender) }!
        func attach(_ user: String, slot: UInt32) -> (DeviceRecord, ConnectionRef) {
            let connection = ConnectionRef(loop: 0, slot: slot, generation: 1)
            let device = switchboard.withState(of: user, wall: 0) { board in
                var effects: [SwitchboardEffect] = []
                return try! board.attach(userID: user, deviceID: "d", resume: nil, connection: connection, now: now, into: &effects)
                    .get().record
            }
            return (device, connection)
        }
        let (senderDevice, senderConnection) = attach(sender, slot: 0)
        let (recipientDevice, recipientConnection) = attach(recipient, slot: 1)
        func acknowledge(_ device: DeviceRecord, _ connection: ConnectionRef, _ user: String, timed holds: inout HoldTimes) {
            let next = holds.timed {
                switchboard.withState(of: user, wall: 0) { board -> [ShardStep] in
                    var effects: [SwitchboardEffect] = []  // no connection to wake
                    return board.ack(device, connection: connection, through: device.lastSeq, into: &effects).next
                }
            }
            holds.run(next, on: switchboard, now: now)
        }
        var holds = HoldTimes()
        var untimed = HoldTimes()
        for round in 0..<rounds {
            for number in 0..<events {
                let message = OutgoingMessage(
                    messageID: "r\(round)m\(number)", recipient: recipient, contentType: "text/plain",
                    body: [UInt8](repeating: 1, count: 64))
                let handOff = switchboard.withState(of: sender, wall: 0) { board -> [ShardStep] in
                    var effects: [SwitchboardEffect] = []  // no connection to wake
                    let acceptance = try! board.send(message, from: senderDevice, now: now, into: &effects).get()
                    return acceptance.handOff.map { [$0] } ?? []
                }
                untimed.run(handOff, on: switchboard, now: now)
            }
            holds.startOperation()
            acknowledge(recipientDevice, recipientConnection, recipient, timed: &holds)
            acknowledge(senderDevice, senderConnection, sender, timed: &untimed)
        }
        return Figures(
            events: events, chunk: chunk, rounds: rounds, holdsPerAck: Double(holds.count) / Double(rounds),
            longestHold: holds.longest, meanLongestHold: holds.meanLongest,
            nanosecondsPerEvent: Double(holds.total) / Double(rounds) / Double(events))
    }
}
