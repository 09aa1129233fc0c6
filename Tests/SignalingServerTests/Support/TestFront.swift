import SignalingProtocol
import SignalingServer
import SignalingStore
import SignalingSupport
import Synchronization
import TestSupport
#if canImport(Glibc)
import Glibc
#endif

/// A real server as a cluster's routing node (the home), with its node link on an
/// in-memory bus, and a `TestFront` that relays devices to it: what a front node would
/// do, played by the test.
final class RelayTestBed {
    let bus = LocalNodeBus()
    let homeLink: LocalNodeLink
    let home: TestServer
    let front: TestFront

    init(workers: Int = 2, connectionSlotsPerLoop: Int? = nil, _ configure: (inout ServerConfiguration) -> Void = { _ in }) throws {
        homeLink = bus.makeLink(named: "home")
        home = try TestServer(workers: workers, relay: homeLink, connectionSlotsPerLoop: connectionSlotsPerLoop, configure)
        let server = home.server
        homeLink.start { server.receive($0) }
        front = TestFront(bus: bus, home: homeLink.nodeID)
    }

    deinit {
        front.link.stop()
        homeLink.stop()
    }

    /// A relayed connection that completed its handshake.
    func connectRelayed(user: String, device: String = "d1") throws -> (RelayedClient, Welcome) {
        let client = front.open()
        return (client, try client.hello(user: user, device: device))
    }
}

/// Plays a front node: opens relayed connections to the home over a `LocalNodeLink`, sends
/// their bytes, and gathers what the home sends back per connection (bytes, then how it
/// ended: `.finish` or `.release`).
final class TestFront: Sendable {
    enum Ending: Equatable { case finish, release }

    struct Received {
        var bytes: [UInt8] = []
        var ending: Ending?
        /// Frames that came after the connection's end (the home must send none).
        var afterEnd = 0
    }

    let link: LocalNodeLink
    let home: String
    private let received = Mutex<[UInt64: Received]>([:])
    private let packets = Atomic<Int>(0)
    private let nextConnection = Atomic<UInt64>(1)

    init(bus: LocalNodeBus, home: String) {
        link = bus.makeLink(named: "front")
        self.home = home
        link.start { [weak self] event in self?.receive(event) }
    }

    private func receive(_ event: NodeLinkEvent) {
        guard case .packet(let bytes) = event, let packet = try? RelayPacket(decoding: bytes) else { return }
        packets.add(1, ordering: .relaxed)
        received.withLock { received in
            for frame in packet.frames {
                switch frame {
                case .data(let connection, let bytes):
                    if received[connection]?.ending != nil { received[connection]!.afterEnd += 1 }
                    received[connection, default: Received()].bytes += bytes
                case .finish(let connection):
                    if received[connection]?.ending != nil { received[connection]!.afterEnd += 1 }
                    received[connection, default: Received()].ending = .finish
                case .release(let connection):
                    // A release after a finish is the home repeating itself: counted.
                    if received[connection]?.ending != nil { received[connection]!.afterEnd += 1 }
                    received[connection, default: Received()].ending = .release
                case .open, .closed, .reset:
                    break
                }
            }
        }
    }

    /// Opens a relayed connection from `peer` (`.open`).
    func open(peer: String = "203.0.113.7:40000", tls: Bool = false) -> RelayedClient {
        let id = nextConnection.add(1, ordering: .relaxed).oldValue
        send([.open(connection: id, peer: peer, tls: tls)])
        return RelayedClient(front: self, connection: id)
    }

    /// Sends one packet to the home.
    func send(_ frames: [RelayPacket.Frame]) {
        link.send(RelayPacket(from: link.nodeID, frames: frames).encoded(), to: home)
    }

    /// Takes the bytes received for `connection` so far, with its ending if it ended.
    func take(_ connection: UInt64) -> (bytes: [UInt8], ending: Ending?) {
        received.withLock { received in
            let entry = received[connection] ?? Received()
            received[connection]?.bytes = []
            return (entry.bytes, entry.ending)
        }
    }

    /// Packets received from the home so far.
    var packetsReceived: Int { packets.load(ordering: .relaxed) }

    func ending(of connection: UInt64) -> Ending? { received.withLock { $0[connection]?.ending } }

    func framesAfterEnd(of connection: UInt64) -> Int { received.withLock { $0[connection]?.afterEnd ?? 0 } }
}

/// One relayed connection as the test's device sees it, through the same `ProtocolClient`
/// steps as a socket's `TestClient`.
final class RelayedClient: ProtocolClient {
    let front: TestFront
    let connection: UInt64
    var skipped: [Frame] = []
    private var assembler = FrameAssembler(maxFrameLength: 16 << 20)

    init(front: TestFront, connection: UInt64) {
        self.front = front
        self.connection = connection
    }

    func send(_ frame: Frame) throws { sendRaw(FrameEncoder.encode(frame)) }

    /// Bytes as the device wrote them, in one `.data` frame.
    func sendRaw(_ bytes: [UInt8]) { front.send([.data(connection: connection, bytes: bytes)]) }

    /// The device's socket ended (`.closed`).
    func close() { front.send([.closed(connection: connection)]) }

    /// How the home ended the connection, if it has.
    var ending: TestFront.Ending? { front.ending(of: connection) }

    /// Waits (bounded) until the home ends the connection, and says how.
    func awaitEnding(timeout: Duration = .seconds(5)) throws -> TestFront.Ending {
        let deadline = SystemClock().now() + timeout
        while SystemClock().now() < deadline {
            if let ending { return ending }
            usleep(1_000)
        }
        throw TestClient.Failure("the home did not end relayed connection \(connection)")
    }

    func read(timeout: Duration) throws -> Frame? {
        let deadline = SystemClock().now() + timeout
        while true {
            if let frame = try assembler.next() { return frame }
            let (bytes, ending) = front.take(connection)
            if !bytes.isEmpty {
                assembler.append(contentsOf: bytes)
                continue
            }
            if ending != nil {
                guard assembler.bufferedCount == 0 else { throw TestClient.Failure("relayed connection ended mid-frame") }
                return nil
            }
            guard SystemClock().now() < deadline else { throw TestClient.Failure("timed out waiting for a relayed frame") }
            usleep(500)
        }
    }

    /// True if nothing arrives for `window` (the connection stays open and silent).
    func staysSilent(for window: Duration = .milliseconds(100)) throws -> Bool {
        do {
            let frame = try next(timeout: window)
            skipped.insert(contentsOf: frame.map { [$0] } ?? [], at: 0)
            return false
        } catch {
            return true
        }
    }
}
