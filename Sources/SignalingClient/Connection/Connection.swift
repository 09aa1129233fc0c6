import SignalingSupport
import Foundation
import Synchronization
import SignalingProtocol
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// What a connection's I/O thread reports to the client.
enum ConnectionInput: Sendable {
    /// Frames decoded from one read, in order.
    case frames([Frame])
    /// The connection is over; the socket is closed and the thread has exited.
    case ended(ConnectionEnd)
}

/// How a connection ended, as seen by its I/O thread.
enum ConnectionEnd: Sendable, Equatable {
    /// The server closed its side (EOF) or reset it.
    case closedByPeer
    /// A read or write failed (ETIMEDOUT after TCP_USER_TIMEOUT, EHOSTUNREACH...).
    case failed(errno: Int32)
    /// TLS failed on an established connection (a bad record, an alert); OpenSSL's words.
    case tlsFailed(String)
    /// The server's bytes broke the protocol.
    case protocolViolation(String)
    /// The client closed it (`close()`).
    case closedLocally
}

/// One established, marked connection and the thread that does its I/O.
///
/// Threading: the socket (and its TLS) belongs to the I/O thread, which polls it together with a
/// wake-up descriptor. Other threads only append to `outgoing` (behind a mutex) and
/// signal; the thread writes, reads, decodes and hands frames to `deliver`, which the
/// client points at its own queue.
final class Connection: Sendable {
    /// Distinguishes this connection's reports from those of connections before it.
    let id: UInt64
    /// The socket, in clear or through TLS.
    let stream: SocketStream
    var socket: SocketHandle { stream.socket }
    let welcome: Welcome
    let localAddress: SocketAddress
    let remoteAddress: SocketAddress

    private struct Outgoing {
        var bytes: [UInt8] = []
        var closeRequested = false
    }
    private let outgoing = Mutex(Outgoing())
    private let wakeup: WakePipe
    /// Signalled once the I/O thread has closed the socket.
    private let ended = DispatchSemaphore(value: 0)

    /// How long `SignalingClient.shutdown` waits for the I/O thread to write what was
    /// queued and close. Writing never waits for the peer (the socket is non-blocking),
    /// so this only bounds a thread that was not scheduled.
    static let closeGrace: Duration = .seconds(1)

    init(id: UInt64, handshaken: HandshakenSocket) throws(ConnectError) {
        self.id = id
        self.stream = handshaken.stream
        self.welcome = handshaken.welcome
        self.localAddress = handshaken.localAddress
        self.remoteAddress = handshaken.remoteAddress
        self.wakeup = try makeWakePipe()
    }

    /// Starts the I/O thread. `leftover` holds bytes the handshake read past WELCOME.
    func start(leftover: [UInt8], deliver: @escaping @Sendable (ConnectionInput) -> Void) {
        // WELCOME's maxFrame bounds what the server accepts; an event it sends carries a
        // message of up to that size plus the sender's fields, so accept twice as much
        // (and at least 1 MiB) without ever trusting an unbounded length.
        let maxFrame = max(2 * Int(welcome.maxFrameLength), 1 << 20)
        let thread = Thread { [self] in
            BrokenPipeSignal.blockOnThisThread()
            var reader = FrameAssembler(maxFrameLength: maxFrame, buffered: leftover)
            let end = runLoop(reader: &reader, deliver: deliver)
            stream.close()  // with TLS close_notify first
            ended.signal()
            deliver(.ended(end))
        }
        thread.name = "vsig-connection-\(id)"
        thread.start()
    }

    /// Queues bytes for the I/O thread to write. Ignored after `close()`.
    func send(_ bytes: [UInt8]) {
        let accepted = outgoing.withLock { state -> Bool in
            guard !state.closeRequested else { return false }
            state.bytes.append(contentsOf: bytes)
            return true
        }
        if accepted { wakeup.signal() }
    }

    /// Asks the I/O thread to write what is queued (without waiting for the peer), close
    /// the socket and report `.closedLocally`.
    func close() {
        outgoing.withLock { $0.closeRequested = true }
        wakeup.signal()
    }

    /// Waits until the I/O thread has closed the socket; false at the timeout.
    @discardableResult
    func waitUntilEnded(timeout: Duration) -> Bool {
        guard ended.wait(timeout: .now() + .nanoseconds(Int(timeout.seconds * 1e9))) == .success else { return false }
        ended.signal()  // for any other waiter
        return true
    }

    /// Shuts the socket down at once from any thread (network path gone, PONG missing):
    /// the I/O thread sees the error and reports the end.
    func abort() {
        close()
        socket.shutdownIfOpen()
    }

    private func runLoop(reader: inout FrameAssembler, deliver: @Sendable (ConnectionInput) -> Void) -> ConnectionEnd {
        var pendingWrite: [UInt8] = []
        var readBuffer = [UInt8](repeating: 0, count: 64 * 1024)
        // What the last read and write wait for. A plain socket reads on POLLIN and writes
        // on POLLOUT; TLS may read on POLLOUT (and write on POLLIN) while it exchanges
        // records of its own.
        var readWaitsFor = SocketStream.Readiness.readable
        var writeWaitsFor = SocketStream.Readiness.writable
        // Frames that arrived with the handshake come first.
        do throws(ProtocolViolation) {
            let frames = try reader.drain()
            if !frames.isEmpty { deliver(.frames(frames)) }
        } catch {
            return .protocolViolation(error.description)
        }
        while true {
            let (more, closeRequested) = outgoing.withLock { state -> ([UInt8], Bool) in
                defer { state.bytes.removeAll(keepingCapacity: true) }
                return (state.bytes, state.closeRequested)
            }
            pendingWrite.append(contentsOf: more)
            if !pendingWrite.isEmpty {
                switch writeSome(&pendingWrite) {
                case .ended(let end):
                    // A write that finds the connection gone can follow the server's CLOSE,
                    // still unread in the receive buffer (the server closed with our bytes
                    // unread, so its kernel reset the connection): read what arrived
                    // first, so that the CLOSE and its advice reach the core before the end.
                    guard case .closedByPeer = end else { return end }
                    for _ in 0..<16 {
                        guard case .delivered = readOnce(&readBuffer, &reader, deliver) else { break }
                    }
                    return end
                case .waiting(let readiness): writeWaitsFor = readiness
                case .done: break
                }
            }
            if closeRequested { return .closedLocally }
            var events = readWaitsFor.pollEvents
            if !pendingWrite.isEmpty { events |= writeWaitsFor.pollEvents }
            var fds = [
                pollfd(fd: socket.descriptor, events: events, revents: 0),
                pollfd(fd: wakeup.readDescriptor, events: Int16(POLLIN), revents: 0),
            ]
            if case .failed(let code) = SystemCall.io({ Int(poll(&fds, 2, -1)) }) { return .failed(errno: code) }
            if fds[1].revents != 0 { wakeup.drain() }
            let ready = fds[0].revents
            let readable = ready & (readWaitsFor.pollEvents | Int16(POLLHUP) | Int16(POLLERR)) != 0
            guard readable else { continue }
            // One read, then more while TLS holds decrypted bytes that no poll will announce.
            repeat {
                switch readOnce(&readBuffer, &reader, deliver) {
                case .delivered: readWaitsFor = .readable
                case .waiting(let readiness): readWaitsFor = readiness
                case .ended(let end): return end
                }
            } while stream.hasBufferedInput
        }
    }

    private enum ReadProgress {
        /// Bytes were read and their whole frames delivered.
        case delivered
        /// Nothing to read; the next read waits for this readiness.
        case waiting(SocketStream.Readiness)
        case ended(ConnectionEnd)
    }

    /// One read from the stream, its whole frames decoded straight out of the read buffer
    /// (only a partial frame is kept) and delivered.
    private func readOnce(
        _ readBuffer: inout [UInt8], _ reader: inout FrameAssembler, _ deliver: @Sendable (ConnectionInput) -> Void
    ) -> ReadProgress {
        switch readBuffer.withUnsafeMutableBytes({ stream.read(into: $0) }) {
        case .moved(let count):
            let decoded = readBuffer.withUnsafeBytes { bytes in
                Result { () throws(ProtocolViolation) in try reader.drain(UnsafeRawBufferPointer(rebasing: bytes[..<count])) }
            }
            switch decoded {
            case .success(let frames):
                if !frames.isEmpty { deliver(.frames(frames)) }
                return .delivered
            case .failure(let violation):
                return .ended(.protocolViolation(violation.description))
            }
        case .wait(let readiness):
            return .waiting(readiness)
        case .closed, .failed(.socket(errno: ECONNRESET)):
            return .ended(.closedByPeer)
        case .failed(.socket(let code)):
            return .ended(.failed(errno: code))
        case .failed(.tls(let error)):
            return .ended(.tlsFailed(error.message))
        }
    }

    private enum WriteProgress {
        case done
        /// The stream took part or nothing; the rest waits for this readiness.
        case waiting(SocketStream.Readiness)
        case ended(ConnectionEnd)
    }

    /// Writes as much as the stream takes.
    private func writeSome(_ bytes: inout [UInt8]) -> WriteProgress {
        while !bytes.isEmpty {
            switch bytes.withUnsafeBytes({ stream.write($0) }) {
            case .moved(let count): bytes.removeFirst(count)
            case .wait(let readiness): return .waiting(readiness)
            case .closed, .failed(.socket(errno: EPIPE)), .failed(.socket(errno: ECONNRESET)): return .ended(.closedByPeer)
            case .failed(.socket(let code)): return .ended(.failed(errno: code))
            case .failed(.tls(let error)): return .ended(.tlsFailed(error.message))
            }
        }
        return .done
    }
}
