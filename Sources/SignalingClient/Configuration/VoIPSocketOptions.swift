/// The socket options that make a long-lived signaling socket behave like a VoIP
/// socket on Linux ("marking" it). On Apple platforms the same step sets the VoIP
/// network service type instead (see `VoIPSocketMarker`).
///
/// Defaults and why:
/// - TCP keep-alive probes start only after the socket was silent for the server's idle
///   timeout (⌈1.5 × keep-alive⌉ from WELCOME): the protocol's own PING comes first, and
///   the kernel's probes only matter when the app could not run (suspended, handler
///   late). Then `keepAliveProbeInterval` × `keepAliveProbeCount` (3 × 10 s) finds a dead
///   peer.
/// - `TCP_USER_TIMEOUT` 30 s: data (a PING, a message) unacknowledged for 30 s kills the
///   connection, so a vanished path is noticed even if no PONG deadline runs; equal to
///   the probe budget above so the two rules agree.
/// - `TCP_NODELAY`: signaling frames are small and latency-sensitive (an INVITE must not
///   wait for Nagle's algorithm).
/// - DSCP CS3 (24, TOS byte 0x60): the class RFC 4594 gives call signaling.
public struct VoIPSocketOptions: Sendable, Equatable {
    /// Seconds of silence before the first TCP keep-alive probe; nil = the server's idle
    /// timeout from WELCOME.
    public var keepAliveIdleSeconds: Int32?
    public var keepAliveProbeIntervalSeconds: Int32 = 10
    public var keepAliveProbeCount: Int32 = 3
    public var userTimeoutMilliseconds: UInt32 = 30_000
    public var noDelay = true
    /// DSCP code point (6 bits); CS3 = 24 for call signaling.
    public var dscp: UInt8 = 24

    public init() {}

    /// The TOS / traffic-class byte: DSCP in the upper six bits, ECN bits zero.
    public var trafficClass: Int32 { Int32(dscp & 0x3F) << 2 }
}
