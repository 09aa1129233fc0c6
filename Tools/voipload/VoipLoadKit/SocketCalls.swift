import SignalingSupport
import CLinuxShims
#if canImport(Glibc)
import Glibc
#endif

/// Thin wrappers over the few socket calls the tool makes, returning errno on failure.
public enum SocketCalls {
    /// Parses "A.B.C.D:PORT" (IPv4 only: the tool only ever talks to loopback).
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

    /// A non-blocking TCP socket bound to `source` (port chosen at connect time, so one
    /// source address can reach the same server from every ephemeral port), with connect
    /// started. Returns the descriptor and whether the connect already completed.
    static func startConnect(from source: UInt32, to destination: sockaddr_in) -> Result<(fd: Int32, connected: Bool), SystemError> {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return .failure(SystemError("socket", errno)) }
        voipload_prepare_client_socket(fd)
        // Every read then also tells when the kernel received the bytes: an event's
        // arrival at the device, whatever the tool is doing at that moment.
        _ = voipload_enable_receive_timestamps(fd)
        var local = socketAddress(source, port: 0)
        let bound = withUnsafePointer(to: &local) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard bound == 0 else {
            let error = SystemError("bind \(dottedQuad(source))", errno)
            close(fd)
            return .failure(error)
        }
        var remote = destination
        let result = withUnsafePointer(to: &remote) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        if result == 0 { return .success((fd, true)) }
        if errno == EINPROGRESS { return .success((fd, false)) }
        let error = SystemError("connect", errno)
        close(fd)
        return .failure(error)
    }

    /// The outcome of a non-blocking connect, once the socket is writable.
    public static func pendingError(_ fd: Int32) -> Int32 {
        var error: Int32 = 0
        var length = socklen_t(MemoryLayout<Int32>.size)
        guard getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) == 0 else { return errno }
        return error
    }

    /// A blocking connect with a deadline, for "is anything listening there?" checks.
    static func canConnect(to endpoint: (address: UInt32, port: UInt16), timeoutMilliseconds: Int32) -> SystemError? {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return SystemError("socket", errno) }
        defer { close(fd) }
        var remote = socketAddress(endpoint.address, port: endpoint.port)
        let result = withUnsafePointer(to: &remote) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        if result == 0 { return nil }
        guard errno == EINPROGRESS else { return SystemError("connect", errno) }
        var entry = pollfd(fd: fd, events: Int16(POLLOUT), revents: 0)
        let ready = poll(&entry, 1, timeoutMilliseconds)
        if ready == 0 { return SystemError("connect", ETIMEDOUT) }
        if ready < 0 { return SystemError("poll", errno) }
        let error = pendingError(fd)
        return error == 0 ? nil : SystemError("connect", error)
    }

    /// A free loopback TCP port, for a server the tool starts itself.
    static func freeLoopbackPort() -> UInt16? {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var address = socketAddress((127 << 24) | 1, port: 0)
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard bound == 0 else { return nil }
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let named = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        return named == 0 ? UInt16(bigEndian: address.sin_port) : nil
    }

    /// Raises the soft descriptor limit to the hard one; returns the limit now in force.
    @discardableResult
    public static func raiseDescriptorLimit() -> UInt64 {
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return 1024 }
        if limit.rlim_cur < limit.rlim_max {
            limit.rlim_cur = limit.rlim_max
            _ = setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
            _ = getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
        }
        return UInt64(limit.rlim_cur)
    }
}
