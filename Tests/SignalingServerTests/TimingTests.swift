import Foundation
import SignalingProtocol
import SignalingSupport
import CLinuxShims
import Testing
@testable import SignalingServer

@Suite("Timers and pacing (pure)")
struct TimingTests {
    @Test("the wheel returns keys when their second comes, not before")
    func wheelBasics() {
        var wheel = TimingWheel(slotCount: 16, startSecond: 100)
        wheel.schedule(1, at: 105)
        wheel.schedule(2, at: 110)
        #expect(wheel.advance(to: 104).isEmpty)
        #expect(wheel.advance(to: 105) == [1])
        #expect(wheel.advance(to: 109).isEmpty)
        #expect(wheel.advance(to: 120) == [2])
        #expect(wheel.count == 0)
    }

    @Test("deadlines beyond one turn come back early and the owner re-enters them")
    func wheelWraps() {
        var wheel = TimingWheel(slotCount: 8, startSecond: 0)
        wheel.schedule(7, at: 20)  // slot 4, reached at second 4 first
        #expect(wheel.advance(to: 4) == [7])
        wheel.schedule(7, at: 20)
        #expect(wheel.advance(to: 12) == [7])
        wheel.schedule(7, at: 20)
        #expect(wheel.advance(to: 19).isEmpty)
        #expect(wheel.advance(to: 20) == [7])
    }

    @Test("a deadline already past fires at the next advance; a long stall visits every slot once")
    func wheelPastAndStall() {
        var wheel = TimingWheel(slotCount: 8, startSecond: 50)
        wheel.schedule(1, at: 10)
        #expect(wheel.advance(to: 51) == [1])
        for key in UInt64(0)..<8 { wheel.schedule(key, at: 52 + UInt32(key)) }
        #expect(Set(wheel.advance(to: 10_000)) == Set(0..<8))
    }

    @Test("keep-alive: never under 600 s, idle timeout ⌈1.5 ×⌉")
    func keepAlive() throws {
        let policy = try KeepAlivePolicy(defaultInterval: 600, maximumInterval: 1800)
        #expect(policy.negotiate(requested: 0) == .grant(interval: 600, idleTimeout: 900))
        #expect(policy.negotiate(requested: 601) == .grant(interval: 601, idleTimeout: 902))
        #expect(policy.negotiate(requested: 5000) == .grant(interval: 1800, idleTimeout: 2700))
        guard case .refuse(let violation) = policy.negotiate(requested: 1) else { Issue.record("accepted 1 s"); return }
        #expect(violation.code == .keepAliveTooShort)
        #expect(throws: KeepAlivePolicy.ConfigurationError.self) { try KeepAlivePolicy(defaultInterval: 900, maximumInterval: 600) }
    }

    @Test("the token bucket admits its burst, then its rate")
    func tokenBucket() {
        let start = Instant(nanoseconds: 1_000_000_000)
        var bucket = TokenBucket(rate: 10, burst: 3, now: start)
        var admitted = 0
        for _ in 0..<3 where bucket.tryTake(now: start) { admitted += 1 }
        #expect(admitted == 3)
        let overBurst = bucket.tryTake(now: start)
        #expect(!overBurst)
        let refilled = bucket.tryTake(now: start + .milliseconds(100))
        #expect(refilled)
        let overRate = bucket.tryTake(now: start + .milliseconds(100))
        #expect(!overRate)
        var unlimited = TokenBucket(rate: 0, burst: 0, now: start)
        var all = 0
        for _ in 0..<10_000 where unlimited.tryTake(now: start) { all += 1 }
        #expect(all == 10_000)
    }

    @Test("an event queue numbers events in order and frees its buffer when empty")
    func eventQueue() {
        var queue = EventQueue(nextSeq: 1)
        let event = QueuedEvent(.callRang(callID: "c", device: "d"), createdAt: 0)
        for expected in UInt64(1)...5 { #expect(queue.append(event) == expected) }
        #expect(queue.event(3) === event && queue.event(5) === event)
        #expect(queue.event(0) == nil && queue.event(6) == nil)
        var removed: [UInt64] = []
        queue.removeThrough(3) { seq, _ in removed.append(seq) }
        #expect(removed == [1, 2, 3])
        #expect(queue.ackedSeq == 3 && queue.count == 2 && queue.lastSeq == 5)
        #expect(queue.event(3) == nil && queue.event(4) === event)
        queue.removeThrough(5) { _, _ in }
        #expect(queue.isEmpty && queue.lastSeq == 5)
        #expect(queue.append(event) == 6)
    }

    @Test("a device record fits a 128-byte heap block (a million idle devices cost 128 MB, not 144)")
    func deviceRecordSize() {
        let record = DeviceRecord(userID: "u", deviceID: "d", sessionID: SessionID(high: 1, low: 2))
        let usable = shim_malloc_usable_size(Unmanaged.passUnretained(record).toOpaque())
        #expect(usable <= 120, "malloc's 8-byte header plus \(usable) usable bytes")
    }

    @Test("a message's event with its receipt (and the sender's shard) fits a 128-byte heap block")
    func queuedEventSize() {
        let receipt = DeliveryReceipt(
            sender: "a sender of twenty-four", messageID: "a message id of 24 bytes", recipient: "a recipient of twenty-4",
            shards: ShardMap(count: 2, index: 0))
        let event = QueuedEvent(.callRang(callID: "c", device: "d"), receipt: receipt, createdAt: 0)
        let usable = shim_malloc_usable_size(Unmanaged.passUnretained(event).toOpaque())
        #expect(usable <= 120, "malloc's 8-byte header plus \(usable) usable bytes")
    }

    @Test("holes in an event queue cost nothing: only real events are pending, and skipped numbers count as acknowledged")
    func eventQueueHoles() {
        var queue = EventQueue(nextSeq: 6001)
        let event = QueuedEvent(.callRang(callID: "c", device: "d"), createdAt: 0)
        for seq: UInt64 in [6001, 6002, 6005] { queue.append(event, as: seq) }
        queue.skip(through: 65_610)  // a restart after a large reservation
        #expect(queue.count == 3 && queue.lastSeq == 65_610 && queue.ackedSeq == 6000)
        #expect(queue.append(event) == 65_611)
        #expect(queue.count == 4)
        var after: [UInt64] = []
        queue.forEach(after: 6002) { seq, _ in after.append(seq); return true }
        #expect(after == [6005, 65_611])
        #expect(queue.event(6003) == nil && queue.event(6005) === event)
        // Acknowledging into a hole acknowledges the hole.
        queue.removeThrough(6003) { _, _ in }
        #expect(queue.ackedSeq == 6004 && queue.count == 2)
        queue.removeThrough(65_611) { _, _ in }
        #expect(queue.isEmpty && queue.ackedSeq == 65_611)
    }
}

@Suite("Configuration")
struct ConfigurationTests {
    @Test("command-line options set every field")
    func options() throws {
        let (configuration, help) = try ServerOptions.configuration(from: [
            "--listen", "127.0.0.1:9000", "--workers", "3", "--keepalive", "900", "--ring-timeout", "45",
            "--call-grace", "5", "--max-frame", "1024", "--max-pending", "50", "--handshake-rate", "0",
            "--session-ttl", "3600", "--log-level", "debug", "--auth-secret", "x",
            "--delivery", "after-commit", "--commit-interval", "0.5",
        ])
        #expect(!help)
        #expect(configuration.host == "127.0.0.1" && configuration.port == 9000)
        #expect(configuration.workers == 3)
        #expect(configuration.keepAlive.defaultInterval == 900)
        #expect(configuration.keepAlive.maximumInterval == 3600)
        #expect(configuration.ringTimeout == .seconds(45))
        #expect(configuration.callGrace == .seconds(5))
        #expect(configuration.maxFrameLength == 1024)
        #expect(configuration.maxPendingEvents == 50)
        #expect(configuration.handshakeRate == 0)
        #expect(configuration.sessionTTL == .seconds(3600))
        #expect(configuration.logLevel == .debug)
        #expect(configuration.authSecret == "x")
        #expect(configuration.delivery == .afterCommit)
        #expect(configuration.commitInterval == .microseconds(500))
    }

    @Test("a configuration file, overridden by the command line")
    func file() throws {
        let path = "/tmp/voipserver-config-\(UInt32.random(in: 0...UInt32.max)).conf"
        let text = """
            # comment
            listen = 127.0.0.1:7000
            keepalive = 1200   # trailing comment
            ring-timeout = 30

            """
        #expect(writeFile(path, text))
        defer { removeFile(path) }
        let (configuration, _) = try ServerOptions.configuration(from: ["--config", path, "--ring-timeout", "20"])
        #expect(configuration.port == 7000)
        #expect(configuration.keepAlive.defaultInterval == 1200)
        #expect(configuration.ringTimeout == .seconds(20))
    }

    @Test("mistakes are usage errors with a clear message", arguments: [
        (["--keepalive", "599"], "600"),
        (["--listen", "nope"], "HOST:PORT"),
        (["--workers", "0"], "between"),
        (["--bogus"], "unknown option"),
        (["--ring-timeout"], "needs a value"),
        (["--log-level", "loud"], "debug"),
        (["--config", "/nonexistent/file"], "cannot read"),
        (["positional"], "unexpected argument"),
        (["--delivery", "eventually"], "immediate or after-commit"),
        (["--commit-interval", "-1"], "commit-interval"),
    ])
    func mistakes(arguments: [String], fragment: String) {
        do {
            _ = try ServerOptions.configuration(from: arguments)
            Issue.record("accepted \(arguments)")
        } catch {
            #expect(error.message.contains(fragment), "\(error.message)")
        }
    }

    @Test("docs/CONFIGURATION.md documents every option voipserver accepts")
    func everyOptionIsDocumented() throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let text = try String(contentsOf: root.appendingPathComponent("docs/CONFIGURATION.md"), encoding: .utf8)
        for option in ServerOptions.parser.options {
            let documented = text.contains("`\(option.name)`") || text.contains("`--\(option.name)")
            #expect(documented, "--\(option.name) is missing from docs/CONFIGURATION.md")
        }
    }

    @Test("a bad line in a configuration file names the file and line")
    func badFile() {
        let path = "/tmp/voipserver-config-\(UInt32.random(in: 0...UInt32.max)).conf"
        #expect(writeFile(path, "keepalive = 600\nworkers\n"))
        defer { removeFile(path) }
        #expect(throws: UsageError("\(path):2: expected 'name = value'")) {
            try ServerOptions.configuration(from: ["--config", path])
        }
    }
}

@Suite("User index (pure)")
struct UserIndexTests {
    private func record(_ user: String) -> DeviceRecord {
        DeviceRecord(userID: user, deviceID: "d", sessionID: SessionID(high: 0, low: 1))
    }

    @Test("random inserts, replacements and deletions agree with a dictionary")
    func agreesWithDictionary() {
        var index = UserIndex()
        var model: [String: DeviceRecord] = [:]
        var generator = FastRandom(seed: (7, 11, 13, 17))
        for step in 0..<40_000 {
            let user = "u\(generator.next() % 3_000)"
            switch generator.next() % 3 {
            case 0, 1:
                let value = record(user)
                index[user] = value
                model[user] = value
            default:
                index[user] = nil
                model[user] = nil
            }
            if step % 997 == 0 {
                #expect(index.count == model.count)
                for (key, value) in model { #expect(index[key] === value, "lost \(key)") }
            }
        }
        #expect(index.count == model.count)
        for (key, value) in model { #expect(index[key] === value) }
        #expect(Set(index.heads.map(\.userID)) == Set(model.keys))
        #expect(index["nobody"] == nil)
    }
}
