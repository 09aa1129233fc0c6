#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// One socket option the marker could not set (marking is best effort: a kernel that
/// refuses the DSCP byte must not cost the app its connection).
public struct MarkingFailure: Sendable, Equatable, CustomStringConvertible {
    public var option: String
    public var errno: Int32
    public var description: String { "\(option): \(String(cString: strerror(errno)))" }
}

/// "Marks the socket as VoIP" (seed digest §2 and §3): done on the calling thread of the
/// connect-then-mark flow, after the handshake and before `connect` returns.
///
/// - Linux: TCP keep-alive (idle/interval/count), `TCP_USER_TIMEOUT`, `TCP_NODELAY`, and
///   DSCP CS3 through `IP_TOS` (IPv4) or `IPV6_TCLASS` (IPv6).
/// - Apple platforms: the VoIP network service type on the socket itself
///   (`SO_NET_SERVICE_TYPE` = `NET_SERVICE_TYPE_VO`, what the article's stream property
///   `kCFStreamNetworkServiceTypeVoIP` sets underneath), plus `TCP_NODELAY`, keep-alive
///   and `TCP_RXT_CONNDROPTIME` (Darwin's counterpart of `TCP_USER_TIMEOUT`).
enum VoIPSocketMarker {
    /// Applies the options; returns those that failed (empty when all were set).
    @discardableResult
    static func mark(_ socket: SocketHandle, options: VoIPSocketOptions, idleTimeoutSeconds: UInt32) -> [MarkingFailure] {
        var failures: [MarkingFailure] = []
        func set(_ name: String, _ level: Int32, _ option: Int32, _ value: Int32) {
            if let code = socket.setIntegerOption(level: level, name: option, value: value) {
                failures.append(MarkingFailure(option: name, errno: code))
            }
        }
        let idle = options.keepAliveIdleSeconds ?? Int32(clamping: max(idleTimeoutSeconds, 1))
        set("SO_KEEPALIVE", SOL_SOCKET, SO_KEEPALIVE, 1)
        if options.noDelay { set("TCP_NODELAY", Int32(IPPROTO_TCP), TCP_NODELAY, 1) }
        #if os(Linux)
        set("TCP_KEEPIDLE", Int32(IPPROTO_TCP), TCP_KEEPIDLE, idle)
        set("TCP_KEEPINTVL", Int32(IPPROTO_TCP), TCP_KEEPINTVL, options.keepAliveProbeIntervalSeconds)
        set("TCP_KEEPCNT", Int32(IPPROTO_TCP), TCP_KEEPCNT, options.keepAliveProbeCount)
        set("TCP_USER_TIMEOUT", Int32(IPPROTO_TCP), Int32(TCP_USER_TIMEOUT), Int32(clamping: options.userTimeoutMilliseconds))
        #elseif canImport(Darwin)
        set("TCP_KEEPALIVE", Int32(IPPROTO_TCP), TCP_KEEPALIVE, idle)
        set("TCP_KEEPINTVL", Int32(IPPROTO_TCP), TCP_KEEPINTVL, options.keepAliveProbeIntervalSeconds)
        set("TCP_KEEPCNT", Int32(IPPROTO_TCP), TCP_KEEPCNT, options.keepAliveProbeCount)
        // Darwin's TCP_RXT_CONNDROPTIME is the closest to TCP_USER_TIMEOUT (seconds).
        set("TCP_RXT_CONNDROPTIME", Int32(IPPROTO_TCP), TCP_RXT_CONNDROPTIME, Int32(clamping: options.userTimeoutMilliseconds / 1000))
        set("SO_NET_SERVICE_TYPE", SOL_SOCKET, SO_NET_SERVICE_TYPE, NET_SERVICE_TYPE_VO)
        #endif
        let family = socket.localAddress()?.family ?? AF_INET
        if family == AF_INET6 {
            set("IPV6_TCLASS", Int32(IPPROTO_IPV6), IPV6_TCLASS, options.trafficClass)
        } else {
            set("IP_TOS", Int32(IPPROTO_IP), IP_TOS, options.trafficClass)
        }
        return failures
    }
}
