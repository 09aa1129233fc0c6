import SignalingProtocol
@testable import SignalingServer
import SignalingStore
import SignalingSupport
import Synchronization
import TestSupport
import Testing

/// A lease the test controls: who holds it, and whether the store answers.
final class FakeLease: StoreLease, Sendable {
    let ttl: Duration
    let ownerID = "node-under-test"
    private let clock: any Clock
    private struct State {
        var holder: String?
        var unreachable = false
        var attempts = 0
        /// When the last acquire or refresh that succeeded was made (the node's send time).
        var confirmedAt: Instant?
    }
    private let state = Mutex(State())

    init(ttl: Duration, clock: any Clock, holder: String? = nil) {
        self.ttl = ttl
        self.clock = clock
        state.withLock { $0.holder = holder }
    }

    var holderNow: String? { state.withLock { $0.holder } }
    var attempts: Int { state.withLock { $0.attempts } }
    var confirmedAt: Instant? { state.withLock { $0.confirmedAt } }
    func setHolder(_ holder: String?) { state.withLock { $0.holder = holder } }
    func setUnreachable(_ unreachable: Bool) { state.withLock { $0.unreachable = unreachable } }

    private enum Answer { case granted, refused, unreachable }

    private func attempt(taking: Bool) throws(StoreError) -> Bool {
        let now = clock.now()
        let answer = state.withLock { state -> Answer in
            state.attempts += 1
            if state.unreachable { return .unreachable }
            guard state.holder == ownerID || (taking && state.holder == nil) else { return .refused }
            state.holder = ownerID
            state.confirmedAt = now
            return .granted
        }
        if answer == .unreachable { throw StoreError(.io, "the store is unreachable") }
        return answer == .granted
    }

    func acquire() throws(StoreError) -> Bool { try attempt(taking: true) }
    func refresh() throws(StoreError) -> Bool { try attempt(taking: false) }
    func release() { state.withLock { if $0.holder == ownerID && !$0.unreachable { $0.holder = nil } } }
    func holder() -> String? { holderNow }
}

/// The active/standby roles of a node on a shared store, with a lease the test controls
/// and an injected clock: no test waits for a lease to expire in real time.
@Suite("Leased node: one active node per store, standbys take over", .serialized)
struct LeasedNodeTests {
    static let ttl: Duration = .seconds(12)

    func makeNode(_ lease: FakeLease, clock: ManualClock) -> LeasedNode {
        var configuration = ServerConfiguration()
        configuration.host = "127.0.0.1"
        configuration.port = 0
        configuration.tickInterval = .milliseconds(5)
        configuration.drainTimeout = .seconds(1)
        configuration.threadPlacement = .off  // as TestServer: many servers in one process
        return LeasedNode(configuration: configuration, lease: lease, clock: clock, logger: .silent) { _ in ModelEventStore() }
    }

    /// A started node on a fresh manual clock and fake lease (held by `holder`, or free);
    /// with a free lease, returned once the node is active. The caller stops the node.
    func startedNode(leaseHeldBy holder: String? = nil) throws -> (clock: ManualClock, lease: FakeLease, node: LeasedNode) {
        let clock = ManualClock()
        let lease = FakeLease(ttl: Self.ttl, clock: clock, holder: holder)
        let node = makeNode(lease, clock: clock)
        node.start()
        if holder == nil {
            guard eventually(10, { node.role == .active }) else {
                node.stop()
                throw TestFailure("the node never became active on a free lease")
            }
        }
        return (clock, lease, node)
    }


    func port(of node: LeasedNode) throws -> UInt16 {
        let description = node.listeningDescription
        return try #require(description.split(separator: ":").last.flatMap { UInt16($0) }, "\(description)")
    }

    @Test("a node waits as a standby while another holds the lease, and serves once it has taken it")
    func standbyTakesOver() throws {
        let (clock, lease, node) = try startedNode(leaseHeldBy: "other-node")
        defer { node.stop() }
        // The reason is set once the attempt has asked who holds the lease: wait for it,
        // not for the attempt (which counts before that, and raced this check).
        #expect(eventually { node.listeningDescription.contains("held by other-node") }, "\(node.listeningDescription)")
        #expect(lease.attempts >= 1)
        #expect(node.role == .standby)

        lease.setHolder(nil)  // the other node's lease expired
        #expect(eventually { clock.advance(by: .milliseconds(100)); return node.role == .active })
        #expect(lease.holderNow == lease.ownerID)
        do {
            let device = try TestClient(port: try port(of: node))
            try device.hello(user: "alice")
        }
    }

    @Test("an active node that cannot refresh its lease steps down before the lease could expire: CLOSE to every device")
    func stepsDownBeforeExpiry() throws {
        let (clock, lease, node) = try startedNode()
        defer { node.stop() }
        // The device leaves once closed: the drain (timed on the frozen clock) waits for it.
        do {
            let device = try TestClient(port: try port(of: node))
            try device.hello(user: "alice")

            lease.setUnreachable(true)
            let confirmed = try #require(lease.confirmedAt)
            // Time moves to each instant the node's lease thread sleeps until (its retries of
            // the refresh), and on only once the node has tried and gone back to sleep, up to
            // three quarters of the TTL after the last confirmed refresh, and stops there:
            // the lease has not expired, yet the node must let go now.
            let stepDown = confirmed + Self.ttl * 3 / 4
            var wake = clock.now()
            while clock.now() < stepDown {
                guard eventually(10, { node.leaseThreadSleepsUntil.map { $0 > wake } ?? false }) else {
                    Issue.record("the lease thread did not go back to sleep after \(wake)")
                    break
                }
                wake = try #require(node.leaseThreadSleepsUntil)
                #expect(wake <= stepDown, "no retry is scheduled past the step-down")
                clock.advance(by: wake - clock.now())
            }
            #expect(clock.now() == stepDown)
            let close = try device.expectClose(timeout: .seconds(10))
            #expect(close.code == .goingAway)
            #expect(clock.now() < confirmed + Self.ttl)
        }
        #expect(lease.attempts >= 3, "it retried the refresh before giving up")
    }

    @Test("an active node whose lease another node took steps down at its next refresh")
    func stepsDownWhenTaken() throws {
        let (clock, lease, node) = try startedNode()
        defer { node.stop() }
        do {
            let device = try TestClient(port: try port(of: node))
            try device.hello(user: "alice")
            lease.setHolder("other-node")
            clock.advance(by: Self.ttl / 3)
            #expect(try device.expectClose(timeout: .seconds(10)).code == .goingAway)
        }
        #expect(eventually { node.role == .standby })
        #expect(lease.holderNow == "other-node", "stepping down never deletes another node's lease")
    }

    @Test("a clean stop of the active node releases the lease at once")
    func stopReleases() throws {
        let (_, lease, node) = try startedNode()
        node.stop()
        #expect(lease.holderNow == nil)
    }

    @Test("--redis-lease-ttl: 10 s by default, in seconds, only with a Redis store")
    func leaseOption() throws {
        #expect(ServerConfiguration().storage.redisLeaseTTL == .seconds(10))
        let (parsed, _) = try ServerOptions.configuration(from: ["--store", "redis://127.0.0.1:6379", "--redis-lease-ttl", "2.5"])
        #expect(parsed.storage.redisLeaseTTL == .milliseconds(2_500))
        #expect(throws: (any Error).self) { try ServerOptions.configuration(from: ["--redis-lease-ttl", "5"]) }
        #expect(throws: (any Error).self) {
            try ServerOptions.configuration(from: ["--store", "redis://127.0.0.1:6379", "--redis-lease-ttl", "0.1"])
        }
    }

    @Test("the lease term: refreshes every third of the TTL, steps down a quarter TTL before expiry, retries never past it")
    func leaseTerm() {
        let start = Instant(nanoseconds: 1_000_000_000_000)
        var term = LeaseTerm(ttl: .seconds(12), acquiredSentAt: start)
        #expect(term.nextRefresh == start + .seconds(4))
        #expect(term.stepDownAt == start + .seconds(9))
        #expect(!term.mustStepDown(now: start + .milliseconds(8_999)))
        #expect(term.mustStepDown(now: start + .seconds(9)))
        term.refreshed(sentAt: start + .seconds(4))
        #expect(term.stepDownAt == start + .seconds(13))
        #expect(term.nextRefresh == start + .seconds(8))
        term.refreshed(sentAt: start + .seconds(1))  // a late reply to an older refresh
        #expect(term.stepDownAt == start + .seconds(13), "an older confirmation never shortens the term")
        term.refreshFailed(now: start + .milliseconds(12_500))
        #expect(term.nextRefresh == start + .seconds(13), "a retry is never scheduled past the step-down")
    }
}
