import CLibeventShims
import SignalingTLS

/// The connections of one event loop, by slot number.
///
/// Storage comes in fixed chunks of `chunkSize` slots: one array of `ConnectionState` and
/// one block of libevent `struct event`s per chunk. Chunks never move, so libevent may keep
/// pointers to the events, and nothing is allocated per connection: a connection costs its
/// 64-byte state plus one `struct event` (128 bytes on x86-64), whatever its lifetime.
/// Free slots are reused most-recently-freed first, which keeps the touched memory small.
///
/// A loop with a TLS listener also keeps each slot's `TLSConnection` in a side table of
/// the same chunks (8 bytes a slot; none without a TLS listener), so that
/// `ConnectionState` stays 64 bytes and plain connections never touch it. An entry is set
/// at accept and taken (to be freed) when the connection is destroyed: none outlives its
/// connection into the slot's next one.
///
/// Used only while the owning event loop's `ownership` lock is held (see `EventLoop`).
struct ConnectionTable {
    static let chunkSize = 1024
    /// The most slots a table can hold: `ConnectionRef` packs 24-bit slots. Beyond any
    /// descriptor limit, so a full table is reached only with a smaller `capacity` (tests).
    static let maximumSlots = 1 << 24

    private var stateChunks: [UnsafeMutablePointer<ConnectionState>] = []
    private var eventChunks: [UnsafeMutableRawPointer] = []
    private var tlsChunks: [UnsafeMutablePointer<TLSConnection?>] = []
    /// The side table of TLS connections exists (the loop has a TLS listener).
    private let holdsTLS: Bool
    private var freeSlots: [UInt32] = []
    private var nextUnused: UInt32 = 0
    /// Slots this table hands out at most (`maximumSlots` but in tests).
    private let capacity: UInt32
    private let eventSize = Int(vs_event_struct_size())
    private(set) var liveCount = 0

    /// - Parameter capacity: the slots it hands out at most, 1 to `maximumSlots`: smaller
    ///   only in tests (`SignalingServer.connectionSlotsPerLoop`), so that a full table
    ///   can be reached.
    init(holdsTLS: Bool = false, capacity: Int = ConnectionTable.maximumSlots) {
        precondition((1...Self.maximumSlots).contains(capacity), "a connection table holds 1 to 2^24 slots")
        self.holdsTLS = holdsTLS
        self.capacity = UInt32(capacity)
    }

    /// A free slot, with a fresh generation; the caller fills in the state. Nil when all
    /// `capacity` slots are in use.
    mutating func allocate() -> UInt32? {
        let slot: UInt32
        if let reused = freeSlots.popLast() {
            slot = reused
        } else {
            guard nextUnused < capacity else { return nil }
            slot = nextUnused
            nextUnused += 1
            if Int(slot) / Self.chunkSize == stateChunks.count { addChunk() }
        }
        let entry = state(slot)
        entry.pointee.generation = entry.pointee.generation &+ 1
        if entry.pointee.generation == 0 { entry.pointee.generation = 1 }
        liveCount += 1
        return slot
    }

    /// Returns a slot to the free list and clears its state (releasing any buffers).
    mutating func release(_ slot: UInt32) {
        let entry = state(slot)
        let generation = entry.pointee.generation
        let inWheel = entry.pointee.inWheel
        entry.pointee = ConnectionState()
        entry.pointee.generation = generation
        entry.pointee.inWheel = inWheel
        freeSlots.append(slot)
        liveCount -= 1
    }

    @inline(__always)
    func state(_ slot: UInt32) -> UnsafeMutablePointer<ConnectionState> {
        stateChunks[Int(slot) / Self.chunkSize] + Int(slot) % Self.chunkSize
    }

    @inline(__always)
    func event(_ slot: UInt32) -> OpaquePointer {
        OpaquePointer(eventChunks[Int(slot) / Self.chunkSize] + (Int(slot) % Self.chunkSize) * eventSize)
    }

    /// The slot's TLS connection (only with `holdsTLS`, while a TLS connection holds it).
    @inline(__always)
    func tls(_ slot: UInt32) -> TLSConnection? {
        tlsChunks[Int(slot) / Self.chunkSize][Int(slot) % Self.chunkSize]
    }

    /// Hands the slot its TLS connection (at accept).
    func setTLS(_ connection: TLSConnection, for slot: UInt32) {
        precondition(holdsTLS && tls(slot) == nil, "a TLS connection outlived its slot's last connection")
        tlsChunks[Int(slot) / Self.chunkSize][Int(slot) % Self.chunkSize] = connection
    }

    /// Removes and returns the slot's TLS connection, for the caller to free exactly once.
    func takeTLS(_ slot: UInt32) -> TLSConnection? {
        guard holdsTLS else { return nil }
        let entry = tlsChunks[Int(slot) / Self.chunkSize] + Int(slot) % Self.chunkSize
        defer { entry.pointee = nil }
        return entry.pointee
    }

    /// Whether `slot` currently holds the connection of that generation. Always inlined,
    /// and reads the two fields through the pointer: a copy of the slot's state (its
    /// device, its buffers, retained and released) and, called, a copy of the table (its
    /// chunk arrays) cost about 400 instructions per message (callgrind, issue 16).
    @inline(__always)
    func isLive(_ slot: UInt32, generation: UInt32) -> Bool {
        guard slot < nextUnused else { return false }
        let entry = state(slot)
        return entry.pointee.generation == generation && entry.pointee.phase != .free
    }

    /// Every slot in use (for shutdown).
    func liveSlots() -> [UInt32] {
        (0..<nextUnused).filter { state($0).pointee.phase != .free }
    }

    private mutating func addChunk() {
        let states = UnsafeMutablePointer<ConnectionState>.allocate(capacity: Self.chunkSize)
        states.initialize(repeating: ConnectionState(), count: Self.chunkSize)
        stateChunks.append(states)
        let events = UnsafeMutableRawPointer.allocate(byteCount: Self.chunkSize * eventSize, alignment: 16)
        events.initializeMemory(as: UInt8.self, repeating: 0, count: Self.chunkSize * eventSize)
        eventChunks.append(events)
        if holdsTLS {
            let connections = UnsafeMutablePointer<TLSConnection?>.allocate(capacity: Self.chunkSize)
            connections.initialize(repeating: nil, count: Self.chunkSize)
            tlsChunks.append(connections)
        }
    }

    /// Frees the chunks. Only after every event has been removed from the loop.
    mutating func deallocate() {
        for chunk in stateChunks {
            chunk.deinitialize(count: Self.chunkSize)
            chunk.deallocate()
        }
        for chunk in eventChunks { chunk.deallocate() }
        for chunk in tlsChunks {
            chunk.deinitialize(count: Self.chunkSize)
            chunk.deallocate()
        }
        stateChunks = []
        eventChunks = []
        tlsChunks = []
    }
}
