import SignalingProtocol
import SignalingStore
@testable import SignalingServer
import SignalingSupport
import TestSupport

/// A real server on an ephemeral loopback port, driven by a manual clock, with a fast
/// tick so that clock changes are noticed within milliseconds.
final class TestServer {
    let server: SignalingServer
    let clock: ManualClock
    var port: UInt16 { server.port }

    /// - Parameters:
    ///   - store: a durable store (nil: memory only). Pass the same store and clock to a
    ///     second `TestServer` to model a restart.
    ///   - logger: where the server logs (tests that check log lines pass one that writes
    ///     to a file).
    ///   - relay: the node link over which the server, as a cluster's routing node, serves
    ///     relayed connections (`SignalingServer.enableRelay`; the test starts the link).
    ///   - allowedCPUs: start as if the process could use only these CPUs (thread
    ///     placement; nil: the process's real mask).
    ///   - connectionSlotsPerLoop: a smaller connection table per loop, to fill it.
    /// What a test server runs with before its test's changes: an ephemeral loopback port,
    /// `workers` loops, a 5 ms tick. Also for tests that build a server or node themselves.
    static func configuration(workers: Int = 2) -> ServerConfiguration {
        var configuration = ServerConfiguration()
        configuration.host = "127.0.0.1"
        configuration.port = 0
        configuration.workers = workers
        configuration.tickInterval = .milliseconds(5)
        // Many servers run at once in the test process: automatic placement would pin every
        // one's loop to the first CPU and its store writer to the next, crowding a core.
        // The scheduler spreads them instead; ThreadPlacementTests cover placement.
        configuration.threadPlacement = .off
        // Nor idle-policy store writers: the test process runs many servers on a manual
        // clock, whose loop 0 sees no time pass while a busy host starves a writer, so it
        // would never raise it. StoreThreadPriorityTests cover the policy.
        configuration.storeThreadPriority = .normal
        // Nor real-time loops: tens of servers' loops under SCHED_FIFO in one process on a
        // 2-core host would preempt the test threads that drive them at every event.
        // LoopRealtimeTests cover the policy.
        configuration.loopRealtime = .off
        return configuration
    }

    init(
        workers: Int = 2, store: (any EventStore)? = nil, clock: ManualClock = ManualClock(),
        logger: Logger = .silent, relay: (any NodeLink)? = nil, allowedCPUs: [Int]? = nil,
        connectionSlotsPerLoop: Int? = nil, _ configure: (inout ServerConfiguration) -> Void = { _ in }
    ) throws {
        var configuration = Self.configuration(workers: workers)
        configure(&configuration)
        self.clock = clock
        server = try SignalingServer(configuration: configuration, clock: clock, logger: logger, store: store)
        if let relay { server.enableRelay(over: relay) }
        if let connectionSlotsPerLoop { server.connectionSlotsPerLoop.store(connectionSlotsPerLoop, ordering: .relaxed) }
        try server.start(allowedCPUs: allowedCPUs ?? CPUList.allowed())
    }

    /// Drains even if the test still holds connections that nobody reads: the frozen
    /// manual clock is moved on until the drain deadline passes.
    deinit {
        server.beginShutdown()
        while server.isRunning {
            clock.advance(by: .seconds(1))
            _ = server.awaitTicks(1, timeout: .milliseconds(50))
        }
        server.waitUntilStopped()
    }

    /// Moves the clock and waits until every loop has acted on the new time.
    func advance(by duration: Duration) throws {
        clock.advance(by: duration)
        guard server.awaitTicks(2) else { throw TestClient.Failure("loops did not tick") }
    }

    /// Moves the clock on by `step` at a time until `condition` holds (at most `maxSteps`
    /// moves). For rules counted from a moment the kernel picks, like the last write a
    /// socket took before a client stopped reading: on a loaded machine that write can land
    /// after an earlier move of the manual clock (the socket's buffers still grow, ACKs are
    /// still in flight), which restarts the count at the new time, so no single move is
    /// known to be enough. Each move is a whole `step`, so a rule that fires within one step
    /// of its moment passes after at most one move past the kernel's last word; the test
    /// checks *when* by what the server says (e.g. the CLOSE's stalled time), not by this.
    func advance(by step: Duration, until what: String, maxSteps: Int = 10, _ condition: (ServerStatistics) -> Bool) throws {
        for _ in 0..<maxSteps {
            try advance(by: step)
            if condition(server.statistics) { return }
        }
        throw TestClient.Failure("\(what) did not happen within \(maxSteps) moves of \(step)")
    }

    func client(sourceAddress: String? = nil) throws -> TestClient {
        try TestClient(port: port, sourceAddress: sourceAddress)
    }

    /// The TLS listener's port (configured with `tls(_:)`).
    var tlsPort: UInt16 { server.tlsPort ?? 0 }

    /// A client that completes a TLS handshake with the TLS listener, trusting `certificates`' CA.
    func tlsClient(_ certificates: TestCertificates, receiveWindow: Int32? = nil) throws -> TestClient {
        try TestClient(port: tlsPort, receiveWindow: receiveWindow, tls: TestTLS(caFile: certificates.caFile))
    }

    /// Sets up a TLS listener on a free loopback port serving `certificates`' server certificate.
    static func tls(_ certificates: TestCertificates, _ configuration: inout ServerConfiguration) {
        configuration.tls = TLSListenerConfiguration(
            host: "127.0.0.1", port: 0, certificateChainFile: certificates.serverChainFile,
            privateKeyFile: certificates.serverKeyFile)
    }

    /// A connected, handshaken client.
    func connect(user: String, device: String = "d1") throws -> (TestClient, Welcome) {
        let client = try client()
        let welcome = try client.hello(user: user, device: device)
        return (client, welcome)
    }

    /// Waits (bounded) until `condition` holds on the server's statistics.
    func waitFor(_ what: String, timeout: Duration = .seconds(5), _ condition: (ServerStatistics) -> Bool) throws {
        let deadline = SystemClock().now() + timeout
        while !condition(server.statistics) {
            guard SystemClock().now() < deadline else { throw TestClient.Failure("timed out waiting for \(what)") }
            _ = server.awaitTicks(1, timeout: .seconds(1))
        }
    }
}
