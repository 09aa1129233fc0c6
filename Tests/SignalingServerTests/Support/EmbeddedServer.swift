import SignalingProtocol
import SignalingSupport
@testable import SignalingServer
#if canImport(Glibc)
import Glibc
#endif

/// A server whose loops have no sockets and no threads, like swift-nio's
/// `EmbeddedEventLoop`: the real `EventLoop`s (their protocol logic: handshake, requests,
/// pumping, deadlines) over the real `Switchboard` (memory store), with connections that
/// are byte buffers (`EmbeddedTransport`, the `ConnectionIO` below the seam) and time that
/// is a `ManualClock`. Nothing runs unless the test does something: every step (a client
/// sends, reads or closes, the clock moves) runs the loops on the test's thread until
/// nothing is left to do (`runUntilQuiet`), so whatever the step caused is there to read
/// at once, and a frame that is not there will not come. Deterministic: loops by index,
/// connections by slot.
///
/// Between its callbacks an embedded loop counts as asleep in epoll, as an idle real loop
/// is, so a loop that routes a few events to another loop's connections writes them
/// itself (`writeFromPeer`) and posts larger batches, closes and replies to its inbox.
///
/// What stays below the seam, and so only in the end-to-end suites over real sockets:
/// libevent, recv/send and their errors, TLS, PROXY headers, accept and socket options,
/// and the store writer's thread.
final class EmbeddedServer {
    let clock: ManualClock
    let context: ServerContext
    let loops: [EventLoop]
    private let transports: [EmbeddedTransport]
    /// The loop the next connection lands on (connections go round the loops, as the
    /// kernel spreads them over SO_REUSEPORT sockets, so the move to the user's home loop
    /// after the HELLO is exercised).
    private var nextLoop = 0

    init(
        workers: Int = 2, clock: ManualClock = ManualClock(), _ configure: (inout ServerConfiguration) -> Void = { _ in }
    ) throws {
        var configuration = ServerConfiguration()
        configuration.workers = workers
        configure(&configuration)
        try configuration.validate()
        self.clock = clock
        let context = ServerContext(
            configuration: configuration, clock: clock, logger: .silent, journaling: false, pushGateway: nil,
            tokenVerifier: try Authentication.verifier(for: configuration))
        self.context = context
        let transports = (0..<workers).map { EmbeddedTransport(loop: $0) }
        self.transports = transports
        var loops: [EventLoop] = []
        for (index, transport) in transports.enumerated() {
            loops.append(try EventLoop(index: UInt16(index), context: context, listenFD: -1, embeddedIO: transport))
        }
        for loop in loops { loop.peers = loops }
        self.loops = loops
    }

    deinit {
        for loop in loops {
            loop.owned {
                for slot in loop.table.liveSlots() { loop.destroy(slot) }
                loop.table.deallocate()
            }
            loop.peers = []  // the loops referred to each other
        }
    }

    var statistics: ServerStatistics {
        context.counters.snapshot(context.switchboard.counters, eventBytes: context.switchboard.eventBytes)
    }

    /// Entries in the loops' timing wheels (idle timeouts and slow-consumer checks).
    var idleWheelEntries: Int { loops.reduce(0) { $0 + $1.wheel.count } }

    // MARK: Connections

    /// A new connection, accepted by loop `loop` (default: the next in turn; after its HELLO
    /// it lives on its user's home loop, `EmbeddedClient.loop`). `receiveWindow`
    /// bounds the bytes it holds unread (the socket buffers of a real connection): past
    /// that, the server's writes come up short and the rest waits in its `outbound`.
    func client(loop: Int? = nil, receiveWindow: Int = .max) throws -> EmbeddedClient {
        let index = loop ?? nextLoop
        nextLoop = (index + 1) % loops.count
        let eventLoop = loops[index]
        let socket = EmbeddedSocket(loop: index, receiveWindow: receiveWindow)
        var opened = false
        callback(of: eventLoop) {
            guard let slot = eventLoop.table.allocate() else { return }
            socket.slot = slot
            transports[index].sockets[slot] = socket
            // Every test client comes from the same address, as over loopback.
            eventLoop.open(slot, fd: -1, addressHash: 1, proxied: false)
            opened = true
        }
        guard opened else { throw TestClient.Failure("the connection table is full") }
        runUntilQuiet()
        return EmbeddedClient(server: self, socket: socket)
    }

    /// A connected, handshaken client.
    func connect(user: String, device: String = "d1", loop: Int? = nil) throws -> (EmbeddedClient, Welcome) {
        let client = try client(loop: loop)
        let welcome = try client.hello(user: user, device: device)
        return (client, welcome)
    }

    // MARK: Time

    /// Moves the clock, then runs every loop's tick (each runs its own shard's routing
    /// deadlines) and whatever the ticks caused.
    func advance(by duration: Duration) {
        clock.advance(by: duration)
        for loop in loops { runCallback(loop) { loop.tick() } }
        runUntilQuiet()
    }

    // MARK: Running the loops

    /// Runs the loops until none has anything left to do: posted tasks, input on a
    /// connection whose input the loop watches, room on a connection whose writability it
    /// watches, a peer's close. What libevent would report, in a fixed order.
    func runUntilQuiet() {
        var rounds = 0
        var progress = true
        while progress {
            rounds += 1
            precondition(rounds < 1_000_000, "the embedded loops never went quiet")
            progress = false
            for (index, loop) in loops.enumerated() {
                if loop.hasPostedTasks {
                    runCallback(loop) { loop.runInbox() }
                    progress = true
                }
                for socket in transports[index].sockets.values.sorted(by: { $0.slot < $1.slot }) {
                    progress = step(socket, on: loop) || progress
                }
            }
        }
    }

    /// One readiness event of `socket`, if it has one; the same steps as
    /// `EventLoop.connectionReady` for a plain socket. Returns whether anything ran.
    private func step(_ socket: EmbeddedSocket, on loop: EventLoop) -> Bool {
        let slot = socket.slot
        if socket.watchesWritable && socket.room > 0 {
            callback(of: loop) { loop.flushOutbound(slot) }
            return true
        }
        guard socket.watchesReadable else { return false }
        if !socket.toServer.isEmpty {
            let count = min(socket.toServer.count, EventLoop.readBufferSize)
            let bytes = Array(socket.toServer.prefix(count))
            socket.toServer.removeFirst(count)
            callback(of: loop) {
                // A closing connection reads and discards (`readAvailable`).
                if loop.table.state(slot).pointee.phase != .closing {
                    bytes.withUnsafeBytes { loop.received(slot, $0) }
                }
            }
            return true
        }
        if socket.closedByClient {
            callback(of: loop) { loop.peerClosed(slot) }
            return true
        }
        return false
    }

    /// A connection's readiness callback, framed as `EventLoop.connectionReady` frames it:
    /// the time is read once, and the events it made for other connections are written
    /// at its end.
    private func callback(of loop: EventLoop, _ body: () -> Void) {
        runCallback(loop) {
            loop.activity &+= 1
            loop.refreshTime()
            body()
            loop.flushDirty()
        }
    }

    /// Runs `body` as one callback of `loop`, as a real loop runs each libevent callback.
    private func runCallback(_ loop: EventLoop, _ body: () -> Void) {
        loop.owned(body)
    }
}

/// One embedded connection's two directions: what the client sent that its loop has not
/// read, and what the loop wrote that the client has not read. The client side of a socket
/// pair, without the socket.
final class EmbeddedSocket {
    /// The loop the connection lives on: the one that accepted it, then its user's home
    /// loop once its HELLO is verified (`EmbeddedTransport.takeOver`).
    var loop: Int
    var slot: UInt32 = 0
    let receiveWindow: Int
    /// Bytes from the client, not yet read by the loop.
    var toServer: [UInt8] = []
    /// Bytes from the loop, not yet read by the client.
    var fromServer: [UInt8] = []
    /// What the loop watches (`ConnectionIO.watch`).
    var watchesReadable = false
    var watchesWritable = false
    /// The loop finished writing (`finishWriting`) or released the connection: after
    /// `fromServer`, the client reads end of stream.
    var endOfStream = false
    /// The loop released the connection's slot.
    var released = false
    /// The client closed its end; the loop sees it once it has read what came before.
    var closedByClient = false

    init(loop: Int, receiveWindow: Int) {
        self.loop = loop
        self.receiveWindow = receiveWindow
    }

    /// Bytes the loop may still write before a write comes up short.
    var room: Int { receiveWindow - fromServer.count }
}

/// An embedded loop's transport: its connections' sockets by slot (the `ConnectionIO` of
/// the seam, see ConnectionIO.swift).
final class EmbeddedTransport: ConnectionIO {
    /// The loop this is the transport of.
    let loop: Int
    var sockets: [UInt32: EmbeddedSocket] = [:]

    init(loop: Int) {
        self.loop = loop
    }

    func transmit(_ bytes: UnsafeRawBufferPointer, to slot: UInt32) -> IOResult {
        guard let socket = sockets[slot], !socket.closedByClient else { return .failed(errno: EPIPE) }
        let count = min(bytes.count, socket.room)
        guard count > 0 else { return .wouldBlock }
        socket.fromServer.append(contentsOf: bytes.prefix(count))
        return .transferred(count)
    }

    func watch(_ slot: UInt32, readable: Bool, writable: Bool) {
        sockets[slot]?.watchesReadable = readable
        sockets[slot]?.watchesWritable = writable
    }

    func finishWriting(_ slot: UInt32) {
        sockets[slot]?.endOfStream = true
    }

    func release(_ slot: UInt32) {
        guard let socket = sockets.removeValue(forKey: slot) else { return }
        socket.endOfStream = true
        socket.released = true
    }

    func handOver(_ slot: UInt32) -> AnyObject {
        sockets.removeValue(forKey: slot)!
    }

    func takeOver(_ connection: AnyObject, in slot: UInt32) {
        let socket = connection as! EmbeddedSocket
        socket.loop = loop
        socket.slot = slot
        sockets[slot] = socket
    }
}

/// A client of an `EmbeddedServer`: the same protocol steps as `TestClient`
/// (`ProtocolClient`), with no waiting. Each send runs the loops until quiet; each read
/// takes what the loops wrote, and throws when they wrote nothing (no frame can come
/// without another step of the test).
final class EmbeddedClient: ProtocolClient {
    let server: EmbeddedServer
    let socket: EmbeddedSocket
    private var assembler = FrameAssembler(maxFrameLength: 16 << 20)
    var skipped: [Frame] = []

    init(server: EmbeddedServer, socket: EmbeddedSocket) {
        self.server = server
        self.socket = socket
    }

    /// Dropping a client closes its connection, as a `TestClient`'s socket closes.
    deinit {
        close()
    }

    /// The loop the connection lives on (after the HELLO: its user's home loop).
    var loop: Int { socket.loop }

    func sendRaw(_ bytes: [UInt8]) throws {
        guard !socket.closedByClient else { throw TestClient.Failure("send on a closed client") }
        socket.toServer.append(contentsOf: bytes)
        server.runUntilQuiet()
    }

    func send(_ frame: Frame) throws { try sendRaw(FrameEncoder.encode(frame)) }

    /// The next frame the loop wrote, or nil after it ended the stream. `timeout` is
    /// ignored: the loops have run until quiet, so what is not there will not come.
    func read(timeout: Duration = .zero) throws -> Frame? {
        while true {
            if let frame = try assembler.next() { return frame }
            if !socket.fromServer.isEmpty {
                assembler.append(contentsOf: socket.fromServer)
                socket.fromServer.removeAll()
                server.runUntilQuiet()  // the client read: room for what waits in `outbound`
                continue
            }
            guard socket.endOfStream else { throw TestClient.Failure("no frame: the server wrote nothing more") }
            guard assembler.bufferedCount == 0 else { throw TestClient.Failure("connection closed mid-frame") }
            return nil
        }
    }

    /// Nothing is there to read, and the server has not ended the stream.
    var isOpenAndQuiet: Bool { !socket.endOfStream && staysSilent }

    /// Nothing is there to read (the loops have run until quiet: nothing more will come
    /// until the test's next step).
    var staysSilent: Bool { skipped.isEmpty && assembler.bufferedCount == 0 && socket.fromServer.isEmpty }

    /// Closes the client's end: the loop sees end of stream once it has read what came
    /// before (as `peerClosed` after a read of 0 bytes).
    func close() {
        guard !socket.closedByClient else { return }
        socket.closedByClient = true
        server.runUntilQuiet()
    }
}
