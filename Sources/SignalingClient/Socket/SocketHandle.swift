import SignalingSupport
import Synchronization
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// An owned socket file descriptor that is closed exactly once.
///
/// Ownership moves from thread to thread (the connect thread creates it, the calling
/// thread marks it, the connection's I/O thread reads and writes it); only the closing is
/// shared, which is why only the closed flag is behind a lock.
final class SocketHandle: Sendable {
    let descriptor: Int32
    private let closed = Mutex(false)

    init(descriptor: Int32) { self.descriptor = descriptor }

    /// Opens a non-blocking, close-on-exec TCP socket of `family` (SocketCalls).
    static func tcp(family: Int32) throws(ConnectError) -> SocketHandle {
        do throws(SystemError) {
            return SocketHandle(descriptor: try SocketCalls.openTCP(family: family, nonBlocking: true))
        } catch {
            throw .socketError(operation: error.call, errno: error.code)
        }
    }

    /// Closes the descriptor; later calls do nothing. The flag's lock is held while
    /// closing, so `shutdownIfOpen` can never hit a reused descriptor number.
    func close() {
        closed.withLock { isClosed in
            guard !isClosed else { return }
            isClosed = true
            #if canImport(Glibc)
            _ = Glibc.close(descriptor)
            #else
            _ = Darwin.close(descriptor)
            #endif
        }
    }

    /// Shuts both directions down (the owning thread's blocking calls fail at once), if
    /// the descriptor is still open. Safe from any thread.
    func shutdownIfOpen() {
        closed.withLock { isClosed in
            guard !isClosed else { return }
            #if canImport(Glibc)
            _ = Glibc.shutdown(descriptor, Int32(SHUT_RDWR))
            #else
            _ = Darwin.shutdown(descriptor, SHUT_RDWR)
            #endif
        }
    }

    deinit { close() }

    /// The local address the kernel chose for this socket.
    func localAddress() -> SocketAddress? {
        var storage = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        let status = withUnsafeMutablePointer(to: &storage) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(descriptor, $0, &length) }
        }
        return status == 0 ? SocketAddress(storage: storage) : nil
    }

    /// The peer's address.
    func remoteAddress() -> SocketAddress? {
        var storage = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        let status = withUnsafeMutablePointer(to: &storage) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getpeername(descriptor, $0, &length) }
        }
        return status == 0 ? SocketAddress(storage: storage) : nil
    }

    /// `send(2)` without SIGPIPE.
    func send(_ buffer: UnsafeRawBufferPointer) -> IOResult { SocketCalls.send(descriptor, buffer) }

    /// `recv(2)` (0 transferred: end of stream).
    func receive(into buffer: UnsafeMutableRawBufferPointer) -> IOResult { SocketCalls.receive(descriptor, into: buffer) }

    /// Reads an integer socket option (tests and diagnostics read the marking back).
    func integerOption(level: Int32, name: Int32) -> Int32? {
        SocketCalls.integerOption(descriptor, level: level, name: name)
    }

    /// Sets an integer socket option; returns errno on failure.
    @discardableResult
    func setIntegerOption(level: Int32, name: Int32, value: Int32) -> Int32? {
        do throws(SystemError) {
            try SocketCalls.setOption(descriptor, level: level, name: name, value)
            return nil
        } catch {
            return error.code
        }
    }
}
