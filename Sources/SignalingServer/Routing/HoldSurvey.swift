import SignalingProtocol
import SignalingSupport

/// The holds whose work grows with an input that is not chunked (docs/LOAD-TESTING.md,
/// "Bounded holds"), and those chunked since (a claim of held messages, a ring, a call's
/// ending) in one hold against in chunks, each timed on the real `Switchboard` (two
/// shards, its locks, its steps) without sockets: what `Tools/routing-bench` prints after
/// the fan-out and ACK cases. Public for that executable only; the server never calls it.
public enum HoldSurvey {
    public struct Figure: Sendable {
        /// What was timed, and how big its input was.
        public let operation: String
        public let size: Int
        /// The longest hold of the operation over every round, and the mean of each
        /// round's longest (ns).
        public let longestHold: UInt64
        public let meanLongestHold: Double
        /// Holds per operation, and the mean hold (ns): what a hold costs without the
        /// preemptions that make the longest on a loaded host.
        public let holdsPerOperation: Double
        public let meanHold: Double

        init(_ operation: String, size: Int, _ times: HoldTimes) {
            self.operation = operation
            self.size = size
            longestHold = times.longest
            meanLongestHold = times.meanLongest
            holdsPerOperation = times.operations == 0 ? 0 : Double(times.count) / Double(times.operations)
            meanHold = times.count == 0 ? 0 : Double(times.total) / Double(times.count)
        }
    }

    /// Every case, `rounds` times each, with `devices` devices where a case grows with a
    /// user's devices and `held` messages for the case that grows with those.
    public static func run(devices: Int, held: Int, rounds: Int) -> [Figure] {
        let cases: [(Int) -> [Figure]] = [
            { syncedCopies(devices: devices, rounds: rounds, chunk: $0) }, { ringing(devices: devices, rounds: rounds, chunk: $0) },
            { ringTimeout(devices: devices, rounds: rounds, chunk: $0) }, { claimingHeld(held, rounds: rounds, chunk: $0) },
        ]
        // Each case in one hold (as before chunks), then in chunks.
        return cases.flatMap { run in [Int.max, SwitchboardState.fanOutChunk].flatMap(run) }
    }

    /// How a row's holds were cut: "one hold" (`chunk` `Int.max`) or "chunks of N".
    private static func chunking(_ chunk: Int) -> String { chunk == Int.max ? "one hold" : "chunks of \(chunk)" }

    /// A bench of two shards; `user(prefix, shard)` names a user on `shard`.
    private struct Bench {
        let switchboard: Switchboard
        let now = Instant(nanoseconds: 1_000_000_000)
        private var slot: UInt32 = 0

        /// `chunk`: events per hold of a claim of held messages, devices per hold of a ring
        /// or of a call's ending (`Int.max`: one hold).
        init(chunk: Int = SwitchboardState.fanOutChunk) {
            switchboard = Switchboard.forBenchmark(journaling: false, shardCount: 2) { $0.fanOutChunk = chunk }
        }

        /// A hold of `user`'s shard running `body`; what it would have the loops do (its
        /// effects) is dropped: the bench has no connections.
        func hold<Result>(of user: String, _ body: (inout SwitchboardState, inout [SwitchboardEffect]) -> Result) -> Result {
            switchboard.withState(of: user, wall: 0) { board in
                var effects: [SwitchboardEffect] = []
                return body(&board, &effects)
            }
        }

        func user(_ prefix: String, onShard index: Int) -> String {
            (0...).lazy.map { "\(prefix)\($0)" }.first { switchboard.shard(of: $0) == index }!
        }

        mutating func attach(_ user: String, _ device: String) -> DeviceRecord {
            attachClaiming(user, device).record
        }

        /// A handshake, with the step that claims the rest of the held messages (if any).
        mutating func attachClaiming(_ user: String, _ device: String) -> (record: DeviceRecord, claim: ShardStep?) {
            slot += 1
            let connection = ConnectionRef(loop: 0, slot: slot, generation: 1)
            return hold(of: user) { board, effects in
                let grant = try! board.attach(userID: user, deviceID: device, resume: nil, connection: connection, now: now,
                    into: &effects).get()
                return (grant.record, grant.claim)
            }
        }

        /// Every device of `devices` acknowledges all it has (not timed).
        func acknowledgeAll(_ devices: [DeviceRecord]) {
            var untimed = HoldTimes()
            for device in devices {
                let next = hold(of: device.userID) { board, effects in
                    board.ack(device, connection: device.connection!, through: device.lastSeq, into: &effects).next
                }
                untimed.run(next, on: switchboard, now: now)
            }
        }
    }

    /// A user with `devices` devices besides the sending one sends to a user of the other
    /// shard: the sender's shard queues the synced copies, `chunk` devices a hold (the
    /// first hold's, then its `continueFanOut` steps until the message goes on), and its
    /// settle step wakes them, `chunk` devices a hold after a hold that touches none; then
    /// the recipient's acknowledgement sends a receipt to every sender device, `chunk`
    /// devices a hold (the rest by its `continueBroadcast` step). Every hold of the three
    /// timed; the recipient's step is not.
    static func syncedCopies(devices: Int, rounds: Int, chunk: Int) -> [Figure] {
        var bench = Bench(chunk: chunk)
        let sender = bench.user("many", onShard: 0), recipient = bench.user("one", onShard: 1)
        let sending = bench.attach(sender, "sending")
        let others = (0..<devices).map { bench.attach(sender, "d\($0)") }
        let recipientDevice = bench.attach(recipient, "d")
        var copies = HoldTimes(), settle = HoldTimes(), receipt = HoldTimes()
        for round in 0..<rounds {
            let message = OutgoingMessage(messageID: "m\(round)", recipient: recipient, contentType: "text/plain", body: [UInt8](repeating: 1, count: 64))
            copies.startOperation()
            let handOff = copies.timed {
                bench.hold(of: sender) { board, effects -> ShardStep in
                    let acceptance = try! board.send(message, from: sending, now: bench.now, into: &effects).get()
                    return acceptance.handOff!
                }
            }
            let delivery = copies.run([handOff], on: bench.switchboard, now: bench.now) { step in
                if case .deliverMessage = step { true } else { false }
            }
            // The recipient's step (not timed), then the sender's settle step.
            let settleSteps = bench.hold(of: recipient) { board, effects -> [ShardStep] in
                let next = board.handle(delivery[0], now: bench.now, into: &effects).next
                return next
            }
            settle.startOperation()
            settle.run(settleSteps, on: bench.switchboard, now: bench.now)
            let receipts = bench.hold(of: recipient) { board, effects -> [ShardStep] in
                let next = board.ack(recipientDevice, connection: recipientDevice.connection!, through: recipientDevice.lastSeq,
                    into: &effects).next
                return next
            }
            receipt.startOperation()
            receipt.run(receipts, on: bench.switchboard, now: bench.now)
            bench.acknowledgeAll(others + [sending])
        }
        let how = chunking(chunk)
        return [
            Figure("synced copies: queueing them (\(how))", size: devices, copies),
            Figure("synced copies: settle step (\(how))", size: devices, settle),
            Figure("receipt to every sender device (\(how))", size: devices, receipt),
        ]
    }

    /// A call to a user with `devices` connected devices on the other shard: the callee's
    /// step rings them, `chunk` a hold (the rest in `continueRing` steps); the first accept
    /// tells the others answeredElsewhere, `chunk` a hold (the rest in `continueBroadcast`
    /// steps), every hold of it timed.
    static func ringing(devices: Int, rounds: Int, chunk: Int) -> [Figure] {
        var bench = Bench(chunk: chunk)
        let caller = bench.user("caller", onShard: 0), callee = bench.user("callee", onShard: 1)
        let callingDevice = bench.attach(caller, "d")
        let calleeDevices = (0..<devices).map { bench.attach(callee, "d\($0)") }
        var ring = HoldTimes(), accept = HoldTimes()
        for round in 0..<rounds {
            let callID = "c\(round)"
            let invite = bench.hold(of: caller) { board, effects -> [ShardStep] in
                let outcome = board.invite(callID: callID, callee: callee, offer: [1, 2, 3], from: callingDevice, now: bench.now,
                    into: &effects)
                return outcome.next
            }
            ring.startOperation()
            ring.run(invite, on: bench.switchboard, now: bench.now)
            accept.startOperation()
            let answered = accept.timed {
                bench.hold(of: callee) { board, effects -> [ShardStep] in
                    let outcome = board.accept(callID: callID, answer: [4], from: calleeDevices[0], into: &effects)
                    return outcome.next
                }
            }
            accept.run(answered, on: bench.switchboard, now: bench.now)
            var untimed = HoldTimes()
            let hungUp = bench.hold(of: callee) { board, effects -> [ShardStep] in
                let outcome = board.hangUp(callID: callID, from: calleeDevices[0], into: &effects)
                return outcome.next
            }
            untimed.run(hungUp, on: bench.switchboard, now: bench.now)
            bench.acknowledgeAll(calleeDevices + [callingDevice])
        }
        let how = chunking(chunk)
        return [
            Figure("ringing a callee's devices (\(how))", size: devices, ring),
            Figure("accept: answeredElsewhere to the others (\(how))", size: devices, accept),
        ]
    }

    /// A call to a user with `devices` connected devices on the other shard rings them all
    /// (not timed); nobody answers, and the ring timeout tells every device noAnswer,
    /// `chunk` devices a hold (the rest in `continueBroadcast` steps), every hold timed
    /// (the timeout's own: an `expire` pass).
    static func ringTimeout(devices: Int, rounds: Int, chunk: Int) -> [Figure] {
        var bench = Bench(chunk: chunk)
        let caller = bench.user("caller", onShard: 0), callee = bench.user("callee", onShard: 1)
        let callingDevice = bench.attach(caller, "d")
        let calleeDevices = (0..<devices).map { bench.attach(callee, "d\($0)") }
        let timeout = bench.switchboard.withState(of: callee, wall: 0) { $0.configuration.ringTimeout }
        var ended = HoldTimes()
        for round in 0..<rounds {
            let invite = bench.hold(of: caller) { board, effects -> [ShardStep] in
                let outcome = board.invite(callID: "t\(round)", callee: callee, offer: [1, 2, 3], from: callingDevice, now: bench.now,
                    into: &effects)
                return outcome.next
            }
            var untimed = HoldTimes()
            untimed.run(invite, on: bench.switchboard, now: bench.now)
            ended.startOperation()
            let later = bench.now + timeout + .seconds(1)
            let next = ended.timed {
                bench.hold(of: callee) { board, effects -> [ShardStep] in
                    let pass = board.expire(now: later, into: &effects)
                    return pass.next
                }
            }
            ended.run(next, on: bench.switchboard, now: later)
            bench.acknowledgeAll(calleeDevices + [callingDevice])
        }
        let how = chunking(chunk)
        return [Figure("ring timeout: noAnswer to every device (\(how))", size: devices, ended)]
    }

    /// `held` messages wait for a user with no device; its first device's handshake
    /// queues them, `chunk` a hold (`HeldClaim`), the claim's steps the rest.
    static func claimingHeld(_ held: Int, rounds: Int, chunk: Int) -> [Figure] {
        var claim = HoldTimes()
        for round in 0..<rounds {
            var bench = Bench(chunk: chunk)
            let sender = bench.user("sender", onShard: 0), recipient = bench.user("new", onShard: 1)
            let sending = bench.attach(sender, "d")
            var untimed = HoldTimes()
            for number in 0..<held {
                let message = OutgoingMessage(messageID: "r\(round)m\(number)", recipient: recipient, contentType: "text/plain", body: [UInt8](repeating: 1, count: 64))
                let handOff = bench.hold(of: sender) { board, effects -> [ShardStep] in
                    let acceptance = try! board.send(message, from: sending, now: bench.now, into: &effects).get()
                    return acceptance.handOff.map { [$0] } ?? []
                }
                untimed.run(handOff, on: bench.switchboard, now: bench.now)
            }
            claim.startOperation()
            let rest = claim.timed { bench.attachClaiming(recipient, "first").claim }
            claim.run(rest.map { [$0] } ?? [], on: bench.switchboard, now: bench.now)
        }
        let how = chunking(chunk)
        return [Figure("first device claiming held messages (\(how))", size: held, claim)]
    }
}
