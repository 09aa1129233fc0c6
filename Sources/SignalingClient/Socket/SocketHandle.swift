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

    /// Opens a non-blocking, close-on-exec TCP socket of `family`.
    static func tcp(family: Int32) throws(ConnectError) -> SocketHandle {
        #if canImport(Glibc)
        let fd = socket(family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        #else
        let fd = socket(family, SOCK_STREAM, 0)
        #endif
        guard fd >= 0 else { throw .socketError(operation: "socket", errno: errno) }
        #if canImport(Darwin)
        _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, socklen_t(MemoryLayout<Int32>.size))
        #endif
        return SocketHandle(descriptor: fd)
    }

    /// `send` flags: never raise SIGPIPE (Darwin sockets use SO_NOSIGPIPE instead).
    #if canImport(Glibc)
    static let sendFlags = Int32(MSG_NOSIGNAL)
    #else
    static let sendFlags: Int32 = 0
    #endif


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

    /// `send(2)` without SIGPIPE; returns the count or -1 with errno set.
    func sendBytes(_ buffer: UnsafeRawBufferPointer) -> Int {
        guard let base = buffer.baseAddress, buffer.count > 0 else { return 0 }
        #if canImport(Glibc)
        return Glibc.send(descriptor, base, buffer.count, Self.sendFlags)
        #else
        return Darwin.send(descriptor, base, buffer.count, Self.sendFlags)
        #endif
    }

    /// `recv(2)`; returns the count, 0 at EOF, or -1 with errno set.
    func receiveBytes(into buffer: UnsafeMutableRawBufferPointer) -> Int {
        #if canImport(Glibc)
        return Glibc.recv(descriptor, buffer.baseAddress, buffer.count, 0)
        #else
        return Darwin.recv(descriptor, buffer.baseAddress, buffer.count, 0)
        #endif
    }

    /// Reads an integer socket option (tests and diagnostics read the marking back).
    func integerOption(level: Int32, name: Int32) -> Int32? {
        var value: Int32 = 0
        var length = socklen_t(MemoryLayout<Int32>.size)
        return getsockopt(descriptor, level, name, &value, &length) == 0 ? value : nil
    }

    /// Sets an integer socket option; returns errno on failure.
    @discardableResult
    func setIntegerOption(level: Int32, name: Int32, value: Int32) -> Int32? {
        var value = value
        return setsockopt(descriptor, level, name, &value, socklen_t(MemoryLayout<Int32>.size)) == 0 ? nil : errno
    }
}
