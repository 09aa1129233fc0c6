import SignalingSupport
import CLinuxShims
#if canImport(Glibc)
import Glibc
#endif

/// The load tool's socket steps, on the shared socket layer (`SocketCalls`, SignalingSupport).
extension SocketCalls {
    /// A non-blocking TCP socket bound to `source` (port chosen at connect time, so one
    /// source address can reach the same server from every ephemeral port), with connect
    /// started. Returns the descriptor and whether the connect already completed.
    static func startConnect(from source: UInt32, to destination: sockaddr_in) -> Result<(fd: Int32, connected: Bool), SystemError> {
        let fd: Int32
        do throws(SystemError) { fd = try openTCP(nonBlocking: true) } catch { return .failure(error) }
        voipload_prepare_client_socket(fd)
        // Every read then also tells when the kernel received the bytes: an event's
        // arrival at the device, whatever the tool is doing at that moment.
        _ = voipload_enable_receive_timestamps(fd)
        do throws(SystemError) {
            try bind(fd, socketAddress(source, port: 0))
            return .success((fd, try connect(fd, destination)))
        } catch {
            close(fd)
            return .failure(error)
        }
    }

    /// A blocking connect with a deadline, for "is anything listening there?" checks.
    static func canConnect(to endpoint: (address: UInt32, port: UInt16), timeoutMilliseconds: Int32) -> SystemError? {
        do throws(SystemError) {
            let fd = try openTCP(nonBlocking: true)
            defer { close(fd) }
            if try connect(fd, socketAddress(endpoint.address, port: endpoint.port)) { return nil }
            guard wait(fd, for: Int16(POLLOUT), milliseconds: timeoutMilliseconds) else { return SystemError("connect", ETIMEDOUT) }
            let error = pendingError(fd)
            return error == 0 ? nil : SystemError("connect", error)
        } catch {
            return error
        }
    }

    /// A free loopback TCP port, for a server the tool starts itself.
    static func freeLoopbackPort() -> UInt16? {
        guard let fd = try? openTCP(nonBlocking: false) else { return nil }
        defer { close(fd) }
        guard (try? bind(fd, socketAddress((127 << 24) | 1, port: 0))) != nil else { return nil }
        return localPort(fd)
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
