#if canImport(Glibc)
import CLinuxShims
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The socket operations every part of the project makes, on `SystemCall`: opening a
/// close-on-exec TCP socket, options, bind, non-blocking connect and its outcome, accept,
/// send and receive. One copy, so that EINTR, SIGPIPE and "would block" are handled the
/// same way in the server, the client library, the tools and the tests. Addresses given as
/// `UInt32` are IPv4 in host byte order.
public enum SocketCalls {
    // MARK: Addresses

    /// Parses "A.B.C.D:PORT" ("localhost" is 127.0.0.1); IPv4 only (the tools talk to
    /// loopback).
    public static func parseEndpoint(_ text: String) -> (address: UInt32, port: UInt16)? {
        guard let colon = text.lastIndex(of: ":") else { return nil }
        guard let port = UInt16(text[text.index(after: colon)...]) else { return nil }
        var host = String(text[..<colon])
        if host == "localhost" { host = "127.0.0.1" }
        let parts = host.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 4 else { return nil }
        var address: UInt32 = 0
        for part in parts {
            guard let byte = UInt8(part) else { return nil }
            address = address << 8 | UInt32(byte)
        }
        return (address, port)
    }

    public static func socketAddress(_ address: UInt32, port: UInt16) -> sockaddr_in {
        var socketAddress = sockaddr_in()
        socketAddress.sin_family = sa_family_t(AF_INET)
        socketAddress.sin_port = port.bigEndian
        socketAddress.sin_addr.s_addr = address.bigEndian
        return socketAddress
    }

    public static func dottedQuad(_ address: UInt32) -> String {
        "\(address >> 24).\(address >> 16 & 255).\(address >> 8 & 255).\(address & 255)"
    }

    // MARK: Sockets and options

    /// A close-on-exec TCP socket of `family`, non-blocking if asked. Writes to it never
    /// raise SIGPIPE when made through `send` (MSG_NOSIGNAL; SO_NOSIGPIPE on Darwin).
    public static func openTCP(family: Int32 = AF_INET, nonBlocking: Bool) throws(SystemError) -> Int32 {
        #if canImport(Glibc)
        var type = Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue)
        if nonBlocking { type |= Int32(SOCK_NONBLOCK.rawValue) }
        return try SystemCall.run("socket") { socket(family, type, 0) }
        #else
        let fd = try SystemCall.run("socket") { socket(family, SOCK_STREAM, 0) }
        _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
        if nonBlocking { try setNonBlocking(fd) }
        try? setOption(fd, level: SOL_SOCKET, name: SO_NOSIGPIPE, 1)
        return fd
        #endif
    }

    /// Sets O_NONBLOCK (for descriptors not opened with it: pipes, accepted sockets).
    public static func setNonBlocking(_ fd: Int32) throws(SystemError) {
        let flags = try SystemCall.run("fcntl(F_GETFL)") { fcntl(fd, F_GETFL) }
        try SystemCall.run("fcntl(F_SETFL)") { fcntl(fd, F_SETFL, flags | O_NONBLOCK) }
    }

    /// Sets FD_CLOEXEC (for descriptors not opened with it).
    public static func setCloseOnExec(_ fd: Int32) throws(SystemError) {
        try SystemCall.run("fcntl(F_SETFD)") { fcntl(fd, F_SETFD, FD_CLOEXEC) }
    }

    /// Sets a socket option of any type (an `Int32`, a `timeval`, a `linger`...).
    public static func setOption<Value: BitwiseCopyable>(_ fd: Int32, level: Int32, name: Int32, _ value: Value) throws(SystemError) {
        var value = value
        try SystemCall.run("setsockopt") {
            withUnsafeBytes(of: &value) { setsockopt(fd, level, name, $0.baseAddress, socklen_t($0.count)) }
        }
    }

    /// Reads an integer socket option; nil if the call fails.
    public static func integerOption(_ fd: Int32, level: Int32, name: Int32) -> Int32? {
        var value: Int32 = 0
        var length = socklen_t(MemoryLayout<Int32>.size)
        return getsockopt(fd, level, name, &value, &length) == 0 ? value : nil
    }

    /// The outcome of a non-blocking connect once the socket is writable (SO_ERROR): 0 for
    /// connected, otherwise its errno.
    public static func pendingError(_ fd: Int32) -> Int32 {
        var error: Int32 = 0
        var length = socklen_t(MemoryLayout<Int32>.size)
        guard getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) == 0 else { return errno }
        return error
    }

    // MARK: Bind, connect, listen, accept

    public static func bind(_ fd: Int32, _ address: sockaddr_in) throws(SystemError) {
        try SystemCall.run("bind \(dottedQuad(UInt32(bigEndian: address.sin_addr.s_addr)))") {
            withSockaddr(address) { systemBind(fd, $0, $1) }
        }
    }

    /// Starts (non-blocking socket) or makes (blocking socket) a connect: true when
    /// connected already, false while in progress (EINPROGRESS: wait for writability,
    /// then read `pendingError`).
    public static func connect(_ fd: Int32, _ address: UnsafePointer<sockaddr>, length: socklen_t) throws(SystemError) -> Bool {
        while true {
            if systemConnect(fd, address, length) == 0 { return true }
            switch errno {
            case EINPROGRESS: return false
            // An interrupted connect goes on in the background, like one in progress.
            case EINTR: return false
            default: throw SystemError("connect", errno)
            }
        }
    }

    public static func connect(_ fd: Int32, _ address: sockaddr_in) throws(SystemError) -> Bool {
        try withSockaddr(address) { pointer, length in
            Result { () throws(SystemError) in try connect(fd, pointer, length: length) }
        }.get()
    }

    /// A listening socket on `address` (SO_REUSEADDR), close-on-exec.
    public static func listenTCP(_ address: sockaddr_in, backlog: Int32 = 128, nonBlocking: Bool = false) throws(SystemError) -> Int32 {
        let fd = try openTCP(nonBlocking: nonBlocking)
        do throws(SystemError) {
            try setOption(fd, level: SOL_SOCKET, name: SO_REUSEADDR, Int32(1))
            try bind(fd, address)
            try SystemCall.run("listen") { listen(fd, backlog) }
            return fd
        } catch {
            close(fd)
            throw error
        }
    }

    /// The port the kernel gave a bound or listening IPv4 socket.
    public static func localPort(_ fd: Int32) -> UInt16? {
        var address = sockaddr_in()
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let named = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        return named == 0 ? UInt16(bigEndian: address.sin_port) : nil
    }

    /// Accepts one connection, close-on-exec (and non-blocking if asked): the descriptor,
    /// or nil when none waits (a non-blocking listener). ECONNABORTED (a connection reset
    /// while queued) counts as none waiting.
    public static func accept(_ listener: Int32, nonBlocking: Bool = false) throws(SystemError) -> Int32? {
        while true {
            #if canImport(Glibc)
            let fd = shim_accept_cloexec(listener)
            #else
            let fd = systemAccept(listener, nil, nil)
            #endif
            if fd >= 0 {
                #if !canImport(Glibc)
                _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
                #endif
                if nonBlocking {
                    do throws(SystemError) { try setNonBlocking(fd) } catch { close(fd); throw error }
                }
                return fd
            }
            switch errno {
            case EINTR: continue
            case EAGAIN, EWOULDBLOCK, ECONNABORTED: return nil
            default: throw SystemError("accept", errno)
            }
        }
    }

    // MARK: I/O

    /// `send` flags: never raise SIGPIPE (Darwin sockets carry SO_NOSIGPIPE instead).
    #if canImport(Glibc)
    public static let noSignal = Int32(MSG_NOSIGNAL)
    #else
    public static let noSignal: Int32 = 0
    #endif

    /// `recv(2)` into `buffer` (0 transferred: the peer closed).
    @inlinable
    public static func receive(_ fd: Int32, into buffer: UnsafeMutableRawBufferPointer, flags: Int32 = 0) -> IOResult {
        SystemCall.io { recv(fd, buffer.baseAddress, buffer.count, flags) }
    }

    /// Takes `count` bytes that a `MSG_PEEK` receive returned off the socket without
    /// copying them (`MSG_TRUNC` on TCP, Linux).
    @inlinable
    public static func discardPeeked(_ fd: Int32, count: Int) -> IOResult {
        #if canImport(Glibc)
        SystemCall.io { recv(fd, nil, count, Int32(MSG_TRUNC | MSG_DONTWAIT)) }
        #else
        .failed(errno: EOPNOTSUPP)
        #endif
    }

    /// `send(2)` of `bytes`, never raising SIGPIPE.
    @inlinable
    public static func send(_ fd: Int32, _ bytes: UnsafeRawBufferPointer, flags: Int32 = 0) -> IOResult {
        guard let base = bytes.baseAddress, !bytes.isEmpty else { return .transferred(0) }
        return SystemCall.io { systemSend(fd, base, bytes.count, flags | noSignal) }
    }

    /// Sends all of `bytes` on a blocking socket (a non-blocking one that is full counts
    /// as a failure, EAGAIN).
    public static func sendAll(_ fd: Int32, _ bytes: UnsafeRawBufferPointer) throws(SystemError) {
        var offset = 0
        while offset < bytes.count {
            switch send(fd, UnsafeRawBufferPointer(rebasing: bytes[offset...])) {
            case .transferred(let count): offset += count
            case .wouldBlock: throw SystemError("send", EAGAIN)
            case .failed(let code): throw SystemError("send", code)
            }
        }
    }

    /// Waits until `fd` has one of `events` (poll(2)); false when `milliseconds` pass
    /// first (-1: no limit). An interruption counts as time passed, not as readiness.
    public static func wait(_ fd: Int32, for events: Int16, milliseconds: Int32) -> Bool {
        var entry = pollfd(fd: fd, events: events, revents: 0)
        return poll(&entry, 1, milliseconds) > 0
    }

    // MARK: Private

    private static func withSockaddr<Value>(_ address: sockaddr_in, _ body: (UnsafePointer<sockaddr>, socklen_t) -> Value) -> Value {
        var address = address
        return withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { body($0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
    }
}

// The C library's names, which `SocketCalls`' own methods shadow.
#if canImport(Glibc)
@usableFromInline let systemSend = Glibc.send
let systemBind = Glibc.bind
let systemConnect = Glibc.connect
#else
@usableFromInline let systemSend = Darwin.send
let systemBind = Darwin.bind
let systemConnect = Darwin.connect
let systemAccept = Darwin.accept
#endif
