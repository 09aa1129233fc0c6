/// Receives the fields of a body in order. An event body is encoded twice through this:
/// once to count its bytes (`FieldSizer`), once into memory of exactly that size
/// (`FieldStore`: a stack buffer copied into the body's array, or for a large body the
/// array itself, `encodeBody`). That makes a body one allocation and a few plain copies,
/// where growing an array field by field cost twice the instructions (this runs for every
/// event a server queues, receipts included).
protocol FieldSink {
    mutating func u8(_ value: UInt8)
    mutating func u64(_ value: UInt64)
    /// A `text` field (u16 length + UTF-8), cut as `ByteWriter.text` cuts it.
    mutating func text(_ value: String)
    /// A `blob` field (u32 length + bytes).
    mutating func blob(_ value: [UInt8])
}

/// Counts the bytes a body will take.
struct FieldSizer: FieldSink {
    private(set) var count = 0

    mutating func u8(_ value: UInt8) { count += 1 }
    mutating func u64(_ value: UInt64) { count += 8 }
    mutating func text(_ value: String) { count += 2 + ByteWriter.encodedTextLength(value.utf8) }
    mutating func blob(_ value: [UInt8]) { count += 4 + value.count }
}

/// Writes a body into memory that `FieldSizer` measured (it must be large enough).
struct FieldStore: FieldSink {
    private let base: UnsafeMutableRawPointer
    private(set) var offset = 0

    init(_ base: UnsafeMutableRawPointer) {
        self.base = base
    }

    mutating func u8(_ value: UInt8) {
        base.storeBytes(of: value, toByteOffset: offset, as: UInt8.self)
        offset += 1
    }

    mutating func u64(_ value: UInt64) {
        base.storeBytes(of: value.bigEndian, toByteOffset: offset, as: UInt64.self)
        offset += 8
    }

    mutating func text(_ value: String) {
        // Read in place where the string's bytes are contiguous (native and small strings):
        // `withUTF8` needs a `var`, and the copy into it retained and released the string's
        // storage, about 40 instructions a field, eight fields a message (callgrind, issue 16).
        if value.utf8.withContiguousStorageIfAvailable({ store(text: $0) }) != nil { return }
        var value = value
        value.withUTF8 { store(text: $0) }
    }

    private mutating func store(text utf8: UnsafeBufferPointer<UInt8>) {
        let length = ByteWriter.encodedTextLength(utf8)
        base.storeBytes(of: UInt16(length).bigEndian, toByteOffset: offset, as: UInt16.self)
        if length > 0 { (base + offset + 2).copyMemory(from: utf8.baseAddress!, byteCount: length) }
        offset += 2 + length
    }

    mutating func blob(_ value: [UInt8]) {
        base.storeBytes(of: UInt32(value.count).bigEndian, toByteOffset: offset, as: UInt32.self)
        value.withUnsafeBytes { bytes in
            if bytes.count > 0 { (base + offset + 4).copyMemory(from: bytes.baseAddress!, byteCount: bytes.count) }
        }
        offset += 4 + value.count
    }
}

extension EncodedEvent {
    /// Encodes an event's body (docs/PROTOCOL.md, "Events"): everything after the sequence
    /// number.
    static func encodeBody(of event: Event) -> [UInt8] {
        var sizer = FieldSizer()
        writeFields(of: event, to: &sizer)
        let count = sizer.count
        guard count > 0 else { return [] }  // every body has a field; no buffer to write into
        guard count <= stagedBodyLimit else {
            return [UInt8](unsafeUninitializedCapacity: count) { buffer, initialized in
                var store = FieldStore(UnsafeMutableRawPointer(buffer.baseAddress!))
                writeFields(of: event, to: &store)
                initialized = store.offset
            }
        }
        // Why staged on the stack and then copied: `[UInt8](unsafeUninitializedCapacity:)`
        // allocates through the standard library's unspecialised generic code, which looks the
        // array storage's metadata up at run time (`getContiguousArrayStorageType`, about 330
        // instructions, twice a message); an array made from a buffer is allocated by code
        // specialised here, whose metadata access is cached. The copy of a body this small
        // costs a few dozen instructions.
        return withUnsafeTemporaryAllocation(of: UInt8.self, capacity: count) { staging in
            var store = FieldStore(UnsafeMutableRawPointer(staging.baseAddress!))
            writeFields(of: event, to: &store)
            return [UInt8](UnsafeBufferPointer(rebasing: staging[..<store.offset]))
        }
    }

    /// The largest body staged on the stack before it is copied into its array (what
    /// `withUnsafeTemporaryAllocation` places on the stack without a check); a larger one is
    /// written into its array directly, where the run-time metadata look-up is small next to
    /// the copy it would need.
    static var stagedBodyLimit: Int { 1024 }

    private static func writeFields<Sink: FieldSink>(of event: Event, to w: inout Sink) {
        switch event {
        case .callIncoming(let callID, let caller, let callerDevice, let offer, let serverTime):
            w.text(callID)
            w.text(caller)
            w.text(callerDevice)
            w.u64(serverTime)
            w.blob(offer)
        case .callRang(let callID, let device):
            w.text(callID)
            w.text(device)
        case .callAccepted(let callID, let device, let answer):
            w.text(callID)
            w.text(device)
            w.blob(answer)
        case .callEnded(let callID, let reason, let peer, let serverTime):
            w.text(callID)
            w.u8(reason.rawValue)
            w.text(peer)
            w.u64(serverTime)
        case .message(let message):
            w.text(message.messageID)
            w.text(message.sender)
            w.text(message.senderDevice)
            w.text(message.recipient)
            w.text(message.contentType)
            w.u64(message.serverTime)
            w.blob(message.body)
        case .messageDelivered(let messageID, let recipient, let recipientDevice, let serverTime):
            w.text(messageID)
            w.text(recipient)
            w.text(recipientDevice)
            w.u64(serverTime)
        }
    }
}
