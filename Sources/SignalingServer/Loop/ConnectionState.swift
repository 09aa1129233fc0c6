import SignalingProtocol

/// Where a connection is in its life.
enum ConnectionPhase: UInt8 {
    /// Accepted; no HELLO yet. Closed if none arrives within the handshake timeout.
    case awaitingHello
    /// HELLO verified on a loop that is not its user's home loop: nothing more is read or
    /// handled here, and when the current callback ends the connection leaves for its home
    /// loop (`EventLoop.handOver`), which registers the device. No `DeviceRecord` refers
    /// to it, so nothing in the routing state can wake or close it meanwhile.
    case handingOver
    /// HELLO accepted and bound to a device; events flow; the idle timeout applies.
    case established
    /// CLOSE written and our side shut down; input is read and discarded until the peer
    /// closes or the linger deadline passes, so the peer can read our CLOSE (closing with
    /// unread input would send a RST that may destroy it).
    case closing
    /// The slot is free.
    case free
}

/// What a connection's libevent event watches, and its timers, in one byte.
struct ConnectionFlags: OptionSet {
    let rawValue: UInt8
    /// The socket event includes VS_EV_WRITE (only while bytes wait in `outbound`, or a
    /// pump yielded to other connections).
    static let wantsWrite = ConnectionFlags(rawValue: 1 << 0)
    /// The connection was counted against its address's cap (refused ones are not).
    static let countsTowardAddress = ConnectionFlags(rawValue: 1 << 1)
    /// Input is not read: the client sends requests faster than it reads their replies,
    /// and more than `--max-queued-bytes` wait for it (back-pressure, not a close).
    static let readPaused = ConnectionFlags(rawValue: 1 << 2)
    /// A slow-consumer check for this connection is in the loop's timing wheel.
    static let stallCheckScheduled = ConnectionFlags(rawValue: 1 << 3)
    /// The pump stopped at an event whose body is in the store only and asked the store
    /// writer for it (`StoreWriter.requestBodies`); it resumes on `LoopTask.bodiesLoaded`.
    static let bodiesRequested = ConnectionFlags(rawValue: 1 << 4)
    /// The listener takes PROXY protocol headers (`--proxy-protocol`) and this
    /// connection's has not arrived yet: its first bytes wait in `inbound` meanwhile, and
    /// it is not yet counted against any address.
    static let awaitingProxyHeader = ConnectionFlags(rawValue: 1 << 5)
    /// Accepted on the TLS listener: its bytes go through the `TLSConnection` in the
    /// table's side table (`ConnectionTable.tls`). Plain connections pay one branch on
    /// this bit, nothing else.
    static let tls = ConnectionFlags(rawValue: 1 << 6)
    /// A relayed connection (docs/ARCHITECTURE.md, "Relayed connections"): a front node
    /// holds the device's socket and relays its bytes; this slot has no descriptor (fd -1)
    /// and its transport is the loop's `RelayIO`.
    static let relayed = ConnectionFlags(rawValue: 1 << 7)
}

/// One connection's state in its event loop's connection table. A plain struct in a
/// table of fixed-size chunks: no per-connection object, and nothing allocated while the
/// connection is idle (`inbound` and `outbound` exist only while bytes are in flight).
/// 64 bytes: keep it so (a test checks).
///
/// Touched only by its event loop's thread, while it holds its `ownership` lock.
struct ConnectionState {
    var fd: Int32 = -1
    /// Incremented each time the slot is reused; part of `ConnectionRef`.
    var generation: UInt32 = 0
    var phase: ConnectionPhase = .free
    var flags: ConnectionFlags = []
    /// The loop's idle-timeout wheel holds an entry for this slot (`enterIdleWheel`). Kept
    /// when the slot is released: the entry stays in the wheel for the slot's next
    /// connection.
    var inWheel = false
    /// Seconds (server timeline) of the last byte received.
    var lastActivity: UInt32 = 0
    /// Seconds of silence after which the connection is closed (set at handshake).
    var idleTimeout: UInt32 = 0
    /// Seconds when bytes started waiting in `outbound`, or when the socket last took
    /// some of them: a client that makes no read progress for `--slow-consumer-timeout`
    /// after this is closed.
    var writeProgressSecond: UInt32 = 0
    /// Bytes of `outbound` already written (always within its first frame's reach: see
    /// `EventLoop.keepUnwritten`).
    var outboundOffset: UInt32 = 0
    /// Hash of the peer's IP address, for the per-address connection cap (behind a load
    /// balancer, of the address its PROXY header names).
    var addressHash: UInt32 = 0
    /// The device's events up to this have been written to this connection.
    var sentSeq: UInt64 = 0
    /// A partial frame waiting for the rest of its bytes (or, while `readPaused`, frames
    /// read but not yet handled).
    var inbound: [UInt8]? = nil
    /// Bytes the socket would not take yet. Starts at a frame boundary, so that frames
    /// not begun can be dropped for a CLOSE (`EventLoop.dropUnstartedFrames`).
    var outbound: [UInt8]? = nil
    /// The device this connection speaks for (established only).
    var device: DeviceRecord? = nil
}
