/// Encodes frames to bytes: a 4-byte big-endian length, the type byte, then the body.
public enum FrameEncoder {
    /// Encodes one frame and returns its bytes.
    public static func encode(_ frame: Frame) -> [UInt8] {
        var out: [UInt8] = []
        append(frame, to: &out)
        return out
    }

    /// Appends one encoded frame to `out`.
    public static func append(_ frame: Frame, to out: inout [UInt8]) {
        switch frame {
        case .event(let seq, let event):
            append(event: EncodedEvent(event), seq: seq, to: &out)
            return
        case .ok(let requestID, let serverTime):
            // Every request's answer: stored whole and appended in one copy (see
            // `appendStaged`), where the general path below cost about 600 instructions.
            appendStaged(ProtocolLimits.lengthPrefixSize + 1 + 4 + 8, to: &out) { raw in
                raw.storeBytes(of: UInt32(1 + 4 + 8).bigEndian, as: UInt32.self)
                raw.storeBytes(of: FrameType.ok.rawValue, toByteOffset: 4, as: UInt8.self)
                raw.storeBytes(of: requestID.bigEndian, toByteOffset: 5, as: UInt32.self)  // unaligned: allowed
                raw.storeBytes(of: serverTime.bigEndian, toByteOffset: 9, as: UInt64.self)
            }
            return
        default:
            break
        }
        let start = out.count
        out.append(contentsOf: [0, 0, 0, 0, frame.type.rawValue])
        var writer = ByteWriter(appendingTo: out)
        out = []  // hand the storage to the writer without a copy
        writeBody(of: frame, to: &writer)
        out = writer.bytes
        patchLength(of: &out, frameStart: start)
    }

    /// Appends an event frame from an event whose body was encoded once, so that one event
    /// fanned out to many devices is encoded only once; only the sequence number differs.
    ///
    /// The 13 bytes before the body (length, type, sequence number) are appended in one
    /// copy (`appendStaged`), as the body is (every event written runs this).
    public static func append(event: EncodedEvent, seq: UInt64, to out: inout [UInt8]) {
        appendStaged(ProtocolLimits.lengthPrefixSize + 1 + 8, to: &out) { raw in
            raw.storeBytes(of: UInt32(1 + 8 + event.body.count).bigEndian, as: UInt32.self)
            raw.storeBytes(of: event.type.rawValue, toByteOffset: 4, as: UInt8.self)
            raw.storeBytes(of: seq.bigEndian, toByteOffset: 5, as: UInt64.self)  // unaligned: allowed
        }
        out.append(contentsOf: event.body)
    }

    /// Appends `count` bytes (a few dozen at most) that `store` writes into a stack buffer,
    /// in one copy. Why: appended through `ByteWriter`, byte by byte, each integer costs a
    /// uniqueness and a capacity check per byte, about 70 instructions; one append of the
    /// buffer costs about as much as one integer did.
    private static func appendStaged(_ count: Int, to out: inout [UInt8], _ store: (UnsafeMutableRawPointer) -> Void) {
        withUnsafeTemporaryAllocation(of: UInt8.self, capacity: count) { buffer in
            store(UnsafeMutableRawPointer(buffer.baseAddress!))
            out.append(contentsOf: UnsafeBufferPointer(buffer))
        }
    }

    private static func patchLength(of out: inout [UInt8], frameStart start: Int) {
        let length = UInt32(out.count - start - ProtocolLimits.lengthPrefixSize)
        out[start] = UInt8(truncatingIfNeeded: length >> 24)
        out[start + 1] = UInt8(truncatingIfNeeded: length >> 16)
        out[start + 2] = UInt8(truncatingIfNeeded: length >> 8)
        out[start + 3] = UInt8(truncatingIfNeeded: length)
    }

    private static func writeBody(of frame: Frame, to w: inout ByteWriter) {
        switch frame {
        case .hello(let hello):
            w.raw(ProtocolLimits.helloMagic)
            w.u16(hello.version)
            var flags: UInt8 = 0
            if hello.credentials != nil { flags |= HelloFlags.credentials }
            if hello.resume != nil { flags |= HelloFlags.resume }
            w.u8(flags)
            w.u32(hello.requestedKeepAliveSeconds)
            w.text(hello.userID)
            w.text(hello.deviceID)
            if let credentials = hello.credentials { w.blob(credentials) }
            if let resume = hello.resume {
                w.sessionID(resume.sessionID)
                w.u64(resume.lastReceivedSeq)
            }
        case .welcome(let welcome):
            w.u16(welcome.version)
            w.sessionID(welcome.sessionID)
            w.u8(welcome.resumed ? WelcomeFlags.resumed : 0)
            w.u32(welcome.keepAliveSeconds)
            w.u32(welcome.idleTimeoutSeconds)
            w.u64(welcome.serverTime)
            w.u32(welcome.maxFrameLength)
            w.u64(welcome.ackedSeq)
            w.u64(welcome.lastSeq)
        case .ping, .pong:
            break
        case .ack(let seq):
            w.u64(seq)
        case .close(let close):
            w.u16(close.code.rawValue)
            w.u8(close.action.rawValue)
            w.u32(close.retryAfterMs)
            w.u32(close.retryJitterMs)
            w.text(close.message)
        case .request(let id, let request):
            w.u32(id)
            writeRequest(request, to: &w)
        case .ok(let requestID, let serverTime):
            w.u32(requestID)
            w.u64(serverTime)
        case .error(let requestID, let code, let message):
            w.u32(requestID)
            w.u16(code.rawValue)
            w.text(message)
        case .event:
            preconditionFailure("events are encoded by append(event:seq:to:)")
        }
    }

    private static func writeRequest(_ request: Request, to w: inout ByteWriter) {
        switch request {
        case .callInvite(let callID, let callee, let offer):
            w.text(callID)
            w.text(callee)
            w.blob(offer)
        case .callRinging(let callID), .callCancel(let callID), .callHangup(let callID):
            w.text(callID)
        case .callAccept(let callID, let answer):
            w.text(callID)
            w.blob(answer)
        case .callReject(let callID, let reason):
            w.text(callID)
            w.u8(reason.rawValue)
        case .messageSend(let message):
            w.text(message.messageID)
            w.text(message.recipient)
            w.text(message.contentType)
            w.blob(message.body)
        case .pushRegister(let platform, let token, let environment, let topic):
            w.text(platform)
            w.blob(token)
            // Optional trailing fields: a topic can only follow an environment.
            if environment != nil || topic != nil { w.text(environment ?? "") }
            if let topic { w.text(topic) }
        }
    }
}

/// An event's type and body (everything after the sequence number), encoded once.
public struct EncodedEvent: Sendable, Equatable {
    public let type: FrameType
    public let body: [UInt8]

    public init(type: FrameType, body: [UInt8]) {
        self.type = type
        self.body = body
    }

    public init(_ event: Event) {
        self.init(type: event.type, body: Self.encodeBody(of: event))
    }

    /// The size of the full frame for this event, prefix included.
    public var frameSize: Int { ProtocolLimits.lengthPrefixSize + 1 + 8 + body.count }
}

enum HelloFlags {
    static let credentials: UInt8 = 0x01
    static let resume: UInt8 = 0x02
}

enum WelcomeFlags {
    static let resumed: UInt8 = 0x01
}
