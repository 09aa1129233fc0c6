import Foundation
import SignalingSupport
#if canImport(Glibc)
import Glibc
#endif

/// A loopback TCP relay between a client and a real server, so a test can cut the
/// connection the way a network does (reset both sides), hold new connections back
/// while it makes the server queue events, or swallow one direction's bytes (both: a
/// partition, where neither end sees the connection end).
public final class TCPRelay: @unchecked Sendable {
    public enum Direction: Sendable { case toServer, toClient }

    public let port: UInt16
    /// The listening socket on an ephemeral loopback port.
    private let listener: Int32
    private var upstreamPort: UInt16
    private let lock = NSLock()
    private var paused = false
    private var held: [Int32] = []
    private var pairs: [(client: Int32, server: Int32)] = []
    private var dropping: Set<Direction> = []
    private var stopped = false

    public init(upstreamPort: UInt16) throws {
        listener = try SocketCalls.listenTCP(SocketCalls.socketAddress(0x7F00_0001, port: 0), backlog: 16)
        guard let port = SocketCalls.localPort(listener) else {
            close(listener)
            throw SystemError("getsockname", errno)
        }
        self.port = port
        self.upstreamPort = upstreamPort
        Thread.detachNewThread { [self] in acceptLoop() }
    }

    deinit {
        stop()
        close(listener)
    }

    public func stop() {
        lock.lock()
        stopped = true
        let waiting = held
        held = []
        lock.unlock()
        waiting.forEach { resetAndClose($0) }
        severAll()
    }

    /// Forwards new connections to another server port (a restarted server).
    public func setUpstream(port: UInt16) { lock.lock(); upstreamPort = port; lock.unlock() }

    /// New connections are accepted but not forwarded until `resume()`.
    public func pause() { lock.lock(); paused = true; lock.unlock() }

    public func resume() {
        lock.lock()
        paused = false
        let waiting = held
        held = []
        lock.unlock()
        waiting.forEach(forward)
    }

    /// Bytes in `direction` are read and discarded (true) or forwarded (false).
    public func setDropping(_ direction: Direction, _ dropping: Bool) {
        lock.lock()
        if dropping { self.dropping.insert(direction) } else { self.dropping.remove(direction) }
        lock.unlock()
    }

    /// Cuts every relayed connection on both sides, like a network that lost the path.
    /// Each pump thread then closes its own descriptors (with a reset).
    ///
    /// The shutdowns are made under the lock, and a pump closes its descriptors under it
    /// too: otherwise a pair's numbers could be closed and handed to the client's new
    /// connection between the listing and the shutdown, which would cut the reconnect
    /// during its handshake.
    public func severAll() {
        lock.lock()
        defer { lock.unlock() }
        for pair in pairs {
            for fd in [pair.client, pair.server] {
                try? SocketCalls.setOption(fd, level: SOL_SOCKET, name: SO_LINGER, linger(l_onoff: 1, l_linger: 0))
                shutdown(fd, Int32(SHUT_RDWR))
            }
        }
    }

    public var connectionCount: Int { lock.lock(); defer { lock.unlock() }; return pairs.count }

    private func acceptLoop() {
        while true {
            lock.lock(); let done = stopped; lock.unlock()
            if done { return }
            guard SocketCalls.wait(listener, for: Int16(POLLIN), milliseconds: 100) else { continue }
            // Close-on-exec: tests on other threads spawn processes, which must not hold it.
            guard let fd = try? SocketCalls.accept(listener) else { continue }
            lock.lock()
            let hold = paused
            if hold { held.append(fd) }
            lock.unlock()
            if !hold { forward(fd) }
        }
    }

    private func forward(_ clientFD: Int32) {
        lock.lock()
        let target = upstreamPort
        lock.unlock()
        guard let serverFD = try? SocketCalls.openTCP(nonBlocking: false) else {
            resetAndClose(clientFD)
            return
        }
        guard (try? SocketCalls.connect(serverFD, SocketCalls.socketAddress(0x7F00_0001, port: target))) != nil else {
            resetAndClose(clientFD)
            close(serverFD)
            return
        }
        lock.lock()
        pairs.append((clientFD, serverFD))
        lock.unlock()
        Thread.detachNewThread { [self] in pump(client: clientFD, server: serverFD) }
    }

    private func pump(client: Int32, server: Int32) {
        var buffer = [UInt8](repeating: 0, count: 16 * 1024)
        defer {
            lock.lock()
            pairs.removeAll { $0.client == client }
            resetAndClose(client)
            resetAndClose(server)
            lock.unlock()
        }
        while true {
            var fds = [pollfd(fd: client, events: Int16(POLLIN), revents: 0), pollfd(fd: server, events: Int16(POLLIN), revents: 0)]
            guard poll(&fds, 2, -1) >= 0 else { if errno == EINTR { continue } else { return } }
            for (index, entry) in fds.enumerated() where entry.revents != 0 {
                let from = index == 0 ? client : server
                let to = index == 0 ? server : client
                guard case .transferred(let count) = buffer.withUnsafeMutableBytes({ SocketCalls.receive(from, into: $0) }), count > 0 else { return }
                lock.lock()
                let drop = dropping.contains(index == 0 ? .toServer : .toClient)
                lock.unlock()
                if !drop { _ = buffer.withUnsafeBytes { SocketCalls.send(to, UnsafeRawBufferPointer(rebasing: $0[..<count])) } }
            }
        }
    }

    private func resetAndClose(_ fd: Int32) {
        try? SocketCalls.setOption(fd, level: SOL_SOCKET, name: SO_LINGER, linger(l_onoff: 1, l_linger: 0))
        close(fd)
    }
}
