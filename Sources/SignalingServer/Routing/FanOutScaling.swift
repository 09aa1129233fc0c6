import CLinuxShims
import SignalingProtocol
import SignalingSupport
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Whether the routing core scales with cores, measured without sockets (issue 16):
/// `threads` threads, each the owner of one shard of a `Switchboard` with as many shards
/// (each thread drives a real `EventLoop` of a `ServerContext` with that many workers, as
/// a server's loops do, without sockets and without libevent), fan messages out to many
/// users spread evenly over all shards. Every step that crosses shards goes through the
/// real path: `Switchboard.run` on the sending loop, `EventLoop.postStep` and the owner's
/// inbox (`LoopTask.steps`, `runInbox`, `Switchboard.runPosted`); each device's ACK is a
/// hold of its own on its owner, whose receipts go back to the sender's shard the same way.
/// What it leaves out: sockets, frame decoding and encoding (the pumps find no live
/// connection), the store. What `Tools/routing-bench scaling` prints
/// (docs/LOAD-TESTING.md, "Routing on more cores"). Public for that executable only; the
/// server never calls it.
public enum FanOutScaling {
    public struct Figures: Sendable {
        public let threads: Int
        public let users: Int
        public let devicesPerUser: Int
        /// Messages every thread sent (each to one user, all of whose devices get a copy and
        /// acknowledge it; each acknowledgement queues a receipt to the sender).
        public let messagesPerThread: Int
        /// Events queued (copies and receipts): `threads × messages × devices × 2`.
        public let events: Int
        public let seconds: Double
        /// CPU time of each thread (its own clock), in seconds.
        public let threadCPUSeconds: [Double]
        /// Steps posted to another loop's inbox, all threads.
        public let stepsPosted: Int
        /// What each thread's turns found, by thread: where the time a thread is not
        /// running goes (counts, so noise-free; `blockedSeconds` is timed).
        public let turns: [TurnCounts]

        public var eventsPerSecond: Double { Double(events) / seconds }
        public var eventsPerSecondPerThread: Double { eventsPerSecond / Double(threads) }
        /// Events per CPU second of the threads (their work, not what the machine gave them).
        public var eventsPerCPUSecond: Double { Double(events) / threadCPUSeconds.reduce(0, +) }
        /// The threads' CPU time over `threads × seconds`: 1 when each had a core all along.
        public var cpuShare: Double { threadCPUSeconds.reduce(0, +) / (Double(threads) * seconds) }
    }

    /// One thread's turns (`Driver.turn`) from the start to its end, and its waits on the
    /// inbox's eventfd: what splits a second thread's loss on the wall into more work per
    /// event and time it was not running.
    public struct TurnCounts: Sendable {
        /// Turns run.
        public var turns = 0
        /// Turns that found nothing to do (no task in the inbox, no ACK, no room to send).
        public var idle = 0
        /// Idle turns that went to sleep on the eventfd (`prepareToSleep` found nothing).
        public var waits = 0
        /// Waits that ended at the timeout, with nothing posted (the last thread running).
        public var timeouts = 0
        /// Time spent in those waits (the poll), seconds.
        public var blockedSeconds = 0.0
        /// Eventfd writes other threads made to wake this thread's loop (`post`).
        public var wakeUpsWritten = 0
    }

    /// `count` user names whose shards, among `shardCount`, are as even as can be: shard
    /// `i` gets `count / shardCount` users, one more for the first `count % shardCount`
    /// shards. Names are `user<n>` for increasing `n` (`ShardMap` is a stable hash), so
    /// the same arguments give the same users.
    public static func users(count: Int, shardCount: Int) -> [String] {
        precondition(count >= 0 && shardCount >= 1)
        var wanted = (0..<shardCount).map { count / shardCount + ($0 < count % shardCount ? 1 : 0) }
        var users: [String] = []
        var number = 0
        while users.count < count {
            let user = "user\(number)"
            number += 1
            let shard = ShardMap.shard(of: user, count: shardCount)
            guard wanted[shard] > 0 else { continue }
            wanted[shard] -= 1
            users.append(user)
        }
        return users
    }

    /// Runs the benchmark: every thread's sender (a one-device user of its own shard)
    /// sends `messagesPerThread` messages, at most `window` not yet complete (every
    /// device's receipt back), to the `users` users in turn, starting at a different user
    /// per thread; each of the `devicesPerUser` devices of a user acknowledges what it got
    /// on its owner's next turn. Returns when every thread's messages are complete.
    ///
    /// `independent`: the host's ceiling instead. Every thread drives a server of its
    /// own (a `ServerContext` with one loop and one shard, all `users` on it), as the run
    /// with one thread does, at the same time as the others: the threads share no state,
    /// no inbox and no memory, so what they lose against one thread alone is the host's
    /// (two vCPUs that are siblings of one core, a neighbour, the hypervisor), not the
    /// shards'. Measured beside the sharded run, it tells the two apart: on this host the
    /// same binary scaled 1.79x one hour and 1.2-1.3x the next (docs/LOAD-TESTING.md,
    /// "The host's ceiling").
    public static func run(
        threads: Int, users userCount: Int, devicesPerUser: Int, messagesPerThread: Int, window: Int = 64,
        busyPoll: Duration = .zero, independent: Bool = false
    ) throws -> Figures {
        precondition(threads >= 1 && userCount >= 1 && devicesPerUser >= 1 && window >= 1)
        var configuration = ServerConfiguration()
        // Room for every event in flight (the window's copies and receipts), and no
        // per-sender rate: nothing is refused.
        configuration.maxPendingEvents = 1_000_000
        // As the server's `--busy-poll`: an idle thread keeps turning this long after its
        // last busy turn before it waits on the eventfd (`EventLoop.runUntilBroken`).
        configuration.busyPoll = busyPoll
        // One server of `threads` loops and shards; or, `independent`, one server of one
        // loop and one shard per thread.
        let servers = independent ? threads : 1
        let shardCount = independent ? 1 : threads
        configuration.workers = shardCount
        let contexts = (0..<servers).map { _ in
            ServerContext(
                configuration: configuration, clock: SystemClock(), logger: .silent, journaling: false, pushGateway: nil,
                tokenVerifier: nil)
        }
        var loops: [EventLoop] = []
        for index in 0..<threads {
            do {
                loops.append(try EventLoop(
                    index: UInt16(independent ? 0 : index), context: contexts[independent ? index : 0], listenFD: -1))
            } catch {
                throw BenchmarkFailure(error.description)
            }
        }
        for loop in loops { loop.peers = independent ? [loop] : loops }
        defer {
            for loop in loops {
                loop.owned { loop.table.deallocate() }
                loop.peers = []  // the loops referred to each other
            }
        }
        let now = contexts[0].now()
        let wall = contexts[0].wallMilliseconds()

        // Devices, each attached on its owner's loop to a connection of that loop that
        // does not exist (wakes find no live slot: no encoding, no socket), by the thread
        // that owns the shard (below), as a server's loop registers its own devices: each
        // shard's records, queues and indexes come from its own thread's malloc arena.
        // Made by one set-up thread (until 3 December 2026), the two shards' records lay
        // side by side in one arena, and cache lines holding records of both moved between
        // the cores with every event written to one of them.
        let recipients = users(count: userCount, shardCount: shardCount)
        @Sendable func attach(_ user: String, _ device: String, on switchboard: Switchboard, slot: inout UInt32) -> Recipient {
            let owner = switchboard.shard(of: user)
            let connection = ConnectionRef(loop: UInt16(owner), slot: slot, generation: 1)
            slot += 1
            let record = switchboard.withState(of: user, wall: wall) { board in
                var effects: [SwitchboardEffect] = []
                return try! board.attach(userID: user, deviceID: device, resume: nil, connection: connection, now: now, into: &effects)
                    .get().record
            }
            return Recipient(user: user, record: record, connection: connection)
        }

        let progress = Progress(threads: threads)
        let clock = SystemClock()
        var start = clock.now()
        let workers = (0..<threads).map { index in
            let loop = loops[index]
            return JoinableThread(name: "fanout-\(index)") {
                shim_set_current_loop(Unmanaged.passUnretained(loop).toOpaque())
                // Each thread owns its loop and its shard as a running loop does: no lock.
                loop.beginOwnedRun()
                defer {
                    loop.endOwnedRun()
                    shim_set_current_loop(nil)
                }
                // Its own users' devices and its sender, before any thread sends (the start
                // below waits for every thread's).
                var slot: UInt32 = 1
                // Independent: all the users, on the one shard of this thread's own server.
                let switchboard = loop.context.switchboard
                let shard = independent ? 0 : index
                let devices = recipients.filter { ShardMap.shard(of: $0, count: shardCount) == shard }.flatMap { user in
                    (0..<devicesPerUser).map { attach(user, "d\($0)", on: switchboard, slot: &slot) }
                }
                let sender = attach(
                    firstName(prefix: "sender", onShard: shard, shardCount: shardCount), "d", on: switchboard, slot: &slot)
                let driver = Driver(
                    loop: loop, sender: sender, devices: devices, recipients: recipients,
                    firstRecipient: index * recipients.count / threads, devicesPerUser: devicesPerUser,
                    messages: messagesPerThread, window: window)
                progress.started.add(1, ordering: .acquiringAndReleasing)
                // All start together (yielding: there may be more threads than cores).
                while progress.started.load(ordering: .acquiring) < threads { sched_yield() }
                let cpuStart = threadCPUSeconds()
                let wakeUpsAtStart = loop.wakeUpsWritten.load(ordering: .relaxed)
                var counts = TurnCounts()
                var done = false
                let pollWindow = busyPoll
                var lastBusy = clock.now()
                // A thread whose messages are complete keeps running its inbox and its
                // devices' ACKs until every thread's are.
                while progress.finished.load(ordering: .acquiring) < threads {
                    let (complete, busy) = driver.turn()
                    counts.turns += 1
                    if complete, !done {
                        done = true
                        progress.finished.add(1, ordering: .acquiringAndReleasing)
                    }
                    if busy {
                        if pollWindow > .zero { lastBusy = clock.now() }
                        continue
                    }
                    // Nothing to do until another loop posts: past the busy-poll window, wait
                    // on the inbox's eventfd as a loop waits in epoll (bounded: the last
                    // thread to finish posts nothing).
                    counts.idle += 1
                    if pollWindow == .zero || clock.now() - lastBusy >= pollWindow {
                        driver.loop.waitForInbox(milliseconds: 1, counting: &counts)
                    }
                }
                let used = threadCPUSeconds() - cpuStart
                progress.cpuSeconds.withLock { $0[index] = used }
                // Written by the other threads: taken after all have joined, less the set-up's.
                counts.wakeUpsWritten = -wakeUpsAtStart
                progress.turns.withLock { $0[index] = counts }
            }
        }
        while progress.started.load(ordering: .acquiring) < threads { sched_yield() }
        start = clock.now()
        for worker in workers { worker.join() }
        let seconds = Double(clock.now().nanoseconds - start.nanoseconds) / 1e9
        return Figures(
            threads: threads, users: userCount, devicesPerUser: devicesPerUser, messagesPerThread: messagesPerThread,
            events: contexts.reduce(0) { $0 + $1.switchboard.counters.eventsQueued }, seconds: seconds,
            threadCPUSeconds: progress.cpuSeconds.withLock { $0 },
            stepsPosted: loops.reduce(0) { $0 + Int($1.metrics.stepsPosted.value) },
            turns: zip(progress.turns.withLock { $0 }, loops).map { counts, loop in
                var counts = counts
                counts.wakeUpsWritten += loop.wakeUpsWritten.load(ordering: .relaxed)
                return counts
            })
    }

    /// The first name `<prefix><n>` that `ShardMap` puts on `shard`.
    static func firstName(prefix: String, onShard shard: Int, shardCount: Int) -> String {
        (0...).lazy.map { "\(prefix)\($0)" }.first { ShardMap.shard(of: $0, count: shardCount) == shard }!
    }

    struct BenchmarkFailure: Error, CustomStringConvertible {
        let description: String
        init(_ description: String) { self.description = description }
    }

    /// What the threads of one run share: how many have started and finished, and each
    /// one's CPU time (written once, at its end).
    final class Progress: Sendable {
        let started = Atomic<Int>(0)
        let finished = Atomic<Int>(0)
        let cpuSeconds: Mutex<[Double]>
        let turns: Mutex<[TurnCounts]>

        init(threads: Int) {
            cpuSeconds = Mutex(Array(repeating: 0, count: threads))
            turns = Mutex(Array(repeating: TurnCounts(), count: threads))
        }
    }

    /// A device and the connection it is attached to.
    struct Recipient {
        let user: String
        let record: DeviceRecord
        let connection: ConnectionRef
    }

    /// One thread's work: its loop's turns. Touched only by that thread.
    final class Driver: @unchecked Sendable {
        let loop: EventLoop
        let sender: Recipient
        /// The devices of the loop's own shard.
        let devices: [Recipient]
        let recipients: [String]
        var nextRecipient: Int
        let devicesPerUser: Int
        let messages: Int
        let window: Int
        var sent = 0
        /// Receipts the sender has got (each one event of its queue).
        var receipts: UInt64 = 0
        /// The sequence number each device of `devices`, and the sender, last acknowledged
        /// through: an ACK of more than a chunk takes its events out over later holds
        /// (`ackedSeq` moves only then), so what was acknowledged is kept here.
        var acknowledged: [UInt64]
        var senderAcknowledged: UInt64 = 0

        init(
            loop: EventLoop, sender: Recipient, devices: [Recipient], recipients: [String], firstRecipient: Int,
            devicesPerUser: Int, messages: Int, window: Int
        ) {
            self.loop = loop
            self.sender = sender
            self.devices = devices
            self.recipients = recipients
            self.nextRecipient = firstRecipient
            self.devicesPerUser = devicesPerUser
            self.messages = messages
            self.window = window
            acknowledged = devices.map(\.record.lastSeq)
            senderAcknowledged = sender.record.lastSeq
        }

        /// Messages complete: every device's receipt is back.
        var complete: Int { Int(receipts) / devicesPerUser }

        /// One turn of the loop, as a server's loop runs (`EventLoop.runUntilBroken`): its
        /// inbox until it is empty (steps other loops posted, and its own next chunks of
        /// an ACK), each run a callback of its own; then the ACKs of the devices with new
        /// events in one callback (their connections' input), and the sender's ACK and its
        /// new messages while the window has room in another (its connection's). The steps
        /// handed on are posted when each callback ends (`EventLoop.owned`), so the
        /// receipts the devices' ACKs made for the other shard's sender leave before this
        /// thread sends, as a server's loop posts them at the end of each connection's
        /// callback. Returns whether this thread's messages are all complete, and whether
        /// the turn found anything to do.
        ///
        /// (Until 3 December 2026 a turn ran the inbox once: a sender's acknowledgement of
        /// more than two chunks of receipts per turn then fell behind, one chunk a turn,
        /// and the receipts it had acknowledged piled up in its queue until the end, freed
        /// with the state: memory grew with the messages sent, with 2 threads only, and
        /// the 2-shard count included 100-220 instructions per event of that teardown,
        /// varying with how the threads interleaved. Until round 5 of crossing shards the
        /// devices' ACKs and the sends were one callback, and the other shard got its
        /// receipts only after this thread's sends.)
        func turn() -> (complete: Bool, busy: Bool) {
            var busy = false
            while loop.hasPostedTasks {
                busy = true
                loop.owned { loop.runInbox() }
            }
            let wall = loop.context.wallMilliseconds()
            // Only this thread changes its shard: reading a record outside a hold is safe.
            if devices.indices.contains(where: { devices[$0].record.lastSeq > acknowledged[$0] }) {
                busy = true
                loop.owned {
                    for (index, device) in devices.enumerated() where device.record.lastSeq > acknowledged[index] {
                        acknowledged[index] = acknowledge(device, wall: wall)
                    }
                    loop.flushDirty()
                }
            }
            let mayAcknowledge = sender.record.lastSeq > senderAcknowledged
            guard mayAcknowledge || (sent < messages && sent - complete < window) else {
                return (complete >= messages, busy)
            }
            busy = true
            // Borrowed, as the server's loops do (`ServerContext.withSwitchboard`): a copy
            // per turn was the last write to the switchboard's count both threads made.
            loop.owned { loop.context.withSwitchboard { switchboard in
                let now = loop.context.now()
                if sender.record.lastSeq > senderAcknowledged {
                    let through = acknowledge(sender, wall: wall)
                    receipts += through - senderAcknowledged
                    senderAcknowledged = through
                }
                while sent < messages && sent - complete < window {
                    send(on: switchboard, now: now, wall: wall)
                }
                loop.flushDirty()
            } }
            return (complete >= messages, busy)
        }

        /// An ACK of everything the device got, as the server runs one
        /// (`EventLoop.acknowledge`, the server's own): a hold of the device's shard, then its steps.
        /// Returns the sequence number acknowledged through.
        private func acknowledge(_ device: Recipient, wall: UInt64) -> UInt64 {
            let through = device.record.lastSeq
            let violation = loop.acknowledge(device.record, connection: device.connection, through: through, wall: wall)
            precondition(violation == nil, "ACK \(through) of \(device.user)")
            return through
        }

        /// A MESSAGE_SEND to the next user, as the server runs one: a hold of the sender's
        /// shard, then the recipient's steps (`Switchboard.runMessage`).
        private func send(on switchboard: Switchboard, now: Instant, wall: UInt64) {
            let recipient = recipients[nextRecipient]
            nextRecipient = (nextRecipient + 1) % recipients.count
            let message = OutgoingMessage(
                messageID: "m\(sent)", recipient: recipient, contentType: "text/plain", body: [UInt8](repeating: 1, count: 64))
            sent += 1
            let shard = switchboard.shard(of: sender.user, connectedOn: loop)
            let (effects, handOff) = switchboard.withState(shard: shard, wall: wall) { board in
                var effects: [SwitchboardEffect] = []
                let acceptance = try! board.send(message, from: sender.record, now: now, into: &effects).get()
                return (effects, acceptance.handOff)
            }
            loop.apply(effects)
            if let handOff {
                loop.apply(switchboard.runMessage(handOff, deferring: nil, on: loop, now: now, wall: wall).effects)
            }
        }
    }

    /// The calling thread's CPU time so far, in seconds.
    static func threadCPUSeconds() -> Double {
        var time = timespec()
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &time)
        return Double(time.tv_sec) + Double(time.tv_nsec) / 1e9
    }
}

extension EventLoop {
    /// Waits until something is posted to the inbox (its eventfd is readable) or
    /// `milliseconds` have passed: what `run` does in epoll, for a loop driven by a
    /// benchmark's thread (`FanOutScaling`).
    /// Counts the waits in `counts` (a clock read either side of each: only when it sleeps).
    fileprivate func waitForInbox(milliseconds: Int32, counting counts: inout FanOutScaling.TurnCounts) {
        guard prepareToSleep() else { return }
        counts.waits += 1
        var descriptor = pollfd(fd: wakeFD, events: Int16(POLLIN), revents: 0)
        let start = SystemClock().now()
        if poll(&descriptor, 1, milliseconds) == 0 { counts.timeouts += 1 }
        counts.blockedSeconds += Double(SystemClock().now().nanoseconds - start.nanoseconds) / 1e9
    }
}
