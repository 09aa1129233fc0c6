/// Decodes frames from a byte stream that may split or join frames anywhere.
///
/// The decoder never allocates according to a length read from the wire: a frame's
/// length is checked against `maxFrameLength` before anything else, and fields are only
/// copied out once all of their bytes are present.
public struct FrameDecoder: Sendable {
    /// The largest `length` (type byte plus body) accepted.
    public var maxFrameLength: Int
    /// The side whose frames this decoder reads: a type the other side sends is refused
    /// with `unknownFrameType` from its type byte alone, before its body is looked at, so
    /// the code does not depend on whether the body happens to parse. Nil accepts every
    /// type (tools that decode both directions).
    public var sender: FrameSender?

    public init(maxFrameLength: Int = ProtocolLimits.defaultMaxFrameLength, from sender: FrameSender? = nil) {
        self.maxFrameLength = maxFrameLength
        self.sender = sender
    }

    /// The total size (prefix included) of the frame starting at `bytes`, once its length
    /// prefix is complete; nil while fewer than four bytes are present.
    public func frameSize(_ bytes: UnsafeRawBufferPointer) throws(ProtocolViolation) -> Int? {
        guard bytes.count >= ProtocolLimits.lengthPrefixSize else { return nil }
        let length = Int(bytes[0]) << 24 | Int(bytes[1]) << 16 | Int(bytes[2]) << 8 | Int(bytes[3])
        guard length > 0 else {
            throw ProtocolViolation(.malformedFrame, "frame length 0: every frame has a type byte")
        }
        guard length <= maxFrameLength else {
            throw ProtocolViolation(.frameTooLarge, "frame length \(length) exceeds the maximum of \(maxFrameLength)")
        }
        return ProtocolLimits.lengthPrefixSize + length
    }

    /// Decodes the frame at the start of `bytes`. Returns the frame and the number of bytes
    /// it used, or nil when the frame is not complete yet.
    public func decode(_ bytes: UnsafeRawBufferPointer) throws(ProtocolViolation) -> (frame: Frame, size: Int)? {
        guard let size = try frameSize(bytes), bytes.count >= size else { return nil }
        let typeByte = bytes[ProtocolLimits.lengthPrefixSize]
        guard let type = FrameType(rawValue: typeByte) else {
            throw ProtocolViolation(.unknownFrameType, "unknown frame type 0x\(String(typeByte, radix: 16))")
        }
        if let sender, !type.isSent(by: sender) {
            throw ProtocolViolation(
                .unknownFrameType,
                "\(type) frames (0x\(String(typeByte, radix: 16))) are sent by \(sender == .client ? "servers, not clients" : "clients, not servers")")
        }
        let body = UnsafeRawBufferPointer(rebasing: bytes[(ProtocolLimits.lengthPrefixSize + 1)..<size])
        var reader = ByteReader(body, context: type)
        // Trailing bytes after the known fields are ignored: later minor revisions may
        // append optional fields (docs/PROTOCOL.md, "Compatibility").
        return (try Self.decodeBody(type: type, from: &reader), size)
    }

    /// Decodes every complete frame in `bytes`; returns them and the bytes consumed.
    public func decodeAll(_ bytes: UnsafeRawBufferPointer) throws(ProtocolViolation) -> (frames: [Frame], consumed: Int) {
        var frames: [Frame] = []
        var offset = 0
        while let (frame, size) = try decode(UnsafeRawBufferPointer(rebasing: bytes[offset...])) {
            frames.append(frame)
            offset += size
        }
        return (frames, offset)
    }

    static func decodeBody(type: FrameType, from r: inout ByteReader) throws(ProtocolViolation) -> Frame {
        switch type {
        case .hello: return .hello(try decodeHello(&r))
        case .welcome: return .welcome(try decodeWelcome(&r))
        case .ping: return .ping
        case .pong: return .pong
        case .ack: return .ack(seq: try r.u64("seq"))
        case .close:
            let rawCode = try r.u16("code")
            guard let code = CloseCode(rawValue: rawCode) else {
                throw ProtocolViolation(.malformedFrame, "unknown close code \(rawCode)")
            }
            let rawAction = try r.u8("action")
            guard let action = ReconnectAction(rawValue: rawAction) else {
                throw ProtocolViolation(.malformedFrame, "unknown reconnect action \(rawAction)")
            }
            return .close(Close(
                code: code, action: action, retryAfterMs: try r.u32("retryAfterMs"),
                retryJitterMs: try r.u32("retryJitterMs"),
                message: try r.text("message", maxBytes: Int(UInt16.max))))
        case .callInvite, .callRinging, .callAccept, .callReject, .callCancel, .callHangup,
             .messageSend, .pushRegister:
            let id = try r.u32("requestId")
            return .request(id: id, try decodeRequest(type: type, &r))
        case .ok:
            return .ok(requestID: try r.u32("requestId"), serverTime: try r.u64("serverTime"))
        case .error:
            let requestID = try r.u32("requestId")
            let rawCode = try r.u16("code")
            guard let code = ErrorCode(rawValue: rawCode) else {
                throw ProtocolViolation(.malformedFrame, "unknown error code \(rawCode)")
            }
            return .error(requestID: requestID, code: code, message: try r.text("message", maxBytes: Int(UInt16.max)))
        case .callIncoming, .callRang, .callAccepted, .callEnded, .message, .messageDelivered:
            let seq = try r.u64("seq")
            return .event(seq: seq, try decodeEvent(type: type, &r))
        }
    }

    static func decodeHello(_ r: inout ByteReader) throws(ProtocolViolation) -> Hello {
        let magic = try r.bytes("magic", count: 4)
        guard magic == ProtocolLimits.helloMagic else {
            throw ProtocolViolation(.malformedFrame, "HELLO does not start with the magic \"VSIG\"")
        }
        let version = try r.u16("version")
        guard version == ProtocolLimits.version else {
            // Checked before the rest so that a future version with a different HELLO
            // layout still gets the right error.
            throw ProtocolViolation(
                .unsupportedVersion,
                "protocol version \(version) is not supported; this server speaks version \(ProtocolLimits.version)")
        }
        let flags = try r.u8("flags")
        let keepAlive = try r.u32("keepAlive")
        let user = try r.identifier("userId")
        let device = try r.identifier("deviceId")
        var credentials: [UInt8]?
        if flags & HelloFlags.credentials != 0 {
            credentials = try r.blob("credentials", maxBytes: ProtocolLimits.maxTokenBytes)
        }
        var resume: ResumePoint?
        if flags & HelloFlags.resume != 0 {
            resume = ResumePoint(sessionID: try r.sessionID("sessionId"), lastReceivedSeq: try r.u64("lastReceivedSeq"))
        }
        return Hello(
            version: version, userID: user, deviceID: device, credentials: credentials,
            resume: resume, requestedKeepAliveSeconds: keepAlive)
    }

    static func decodeWelcome(_ r: inout ByteReader) throws(ProtocolViolation) -> Welcome {
        let version = try r.u16("version")
        let session = try r.sessionID("sessionId")
        let flags = try r.u8("flags")
        return Welcome(
            version: version, sessionID: session, resumed: flags & WelcomeFlags.resumed != 0,
            keepAliveSeconds: try r.u32("keepAlive"), idleTimeoutSeconds: try r.u32("idleTimeout"),
            serverTime: try r.u64("serverTime"), maxFrameLength: try r.u32("maxFrame"),
            ackedSeq: try r.u64("ackedSeq"), lastSeq: try r.u64("lastSeq"))
    }

    static func decodeRequest(type: FrameType, _ r: inout ByteReader) throws(ProtocolViolation) -> Request {
        switch type {
        case .callInvite:
            return .callInvite(
                callID: try r.identifier("callId"), callee: try r.identifier("callee"), offer: try r.blob("offer"))
        case .callRinging: return .callRinging(callID: try r.identifier("callId"))
        case .callAccept:
            return .callAccept(callID: try r.identifier("callId"), answer: try r.blob("answer"))
        case .callReject:
            let callID = try r.identifier("callId")
            let raw = try r.u8("reason")
            guard let reason = CallEndReason(rawValue: raw), reason.isRejectReason else {
                throw ProtocolViolation(.invalidField, "reject reason \(raw) is not declined (3) or busy (4)")
            }
            return .callReject(callID: callID, reason: reason)
        case .callCancel: return .callCancel(callID: try r.identifier("callId"))
        case .callHangup: return .callHangup(callID: try r.identifier("callId"))
        case .messageSend:
            return .messageSend(OutgoingMessage(
                messageID: try r.identifier("messageId"), recipient: try r.identifier("recipient"),
                contentType: try r.text("contentType", minBytes: 1, maxBytes: ProtocolLimits.maxShortTextBytes),
                body: try r.blob("body")))
        case .pushRegister:
            let platform = try r.text("platform", minBytes: 1, maxBytes: ProtocolLimits.maxShortTextBytes)
            let token = try r.blob("token", maxBytes: ProtocolLimits.maxTokenBytes)
            // Optional trailing fields, present only when bytes remain. Bytes that remain
            // must be a whole environment (and then a whole topic): a stray byte after the
            // token is malformed, not ignored, since it cannot be a field of this revision.
            let environment: String? =
                if r.remaining > 0 { try r.text("environment", maxBytes: ProtocolLimits.maxPushEnvironmentBytes) } else { nil }
            let topic: String? =
                if r.remaining > 0 { try r.text("topic", maxBytes: ProtocolLimits.maxShortTextBytes) } else { nil }
            return .pushRegister(platform: platform, token: token, environment: environment, topic: topic)
        default:
            preconditionFailure("not a request type: \(type)")
        }
    }

    static func decodeEvent(type: FrameType, _ r: inout ByteReader) throws(ProtocolViolation) -> Event {
        switch type {
        case .callIncoming:
            let callID = try r.identifier("callId")
            let caller = try r.identifier("caller")
            let callerDevice = try r.identifier("callerDevice")
            let serverTime = try r.u64("serverTime")
            let offer = try r.blob("offer")
            return .callIncoming(
                callID: callID, caller: caller, callerDevice: callerDevice, offer: offer, serverTime: serverTime)
        case .callRang:
            return .callRang(callID: try r.identifier("callId"), device: try r.identifier("device"))
        case .callAccepted:
            return .callAccepted(
                callID: try r.identifier("callId"), device: try r.identifier("device"), answer: try r.blob("answer"))
        case .callEnded:
            let callID = try r.identifier("callId")
            let raw = try r.u8("reason")
            guard let reason = CallEndReason(rawValue: raw) else {
                throw ProtocolViolation(.malformedFrame, "unknown call end reason \(raw)")
            }
            return .callEnded(
                callID: callID, reason: reason, peer: try r.identifier("peer"), serverTime: try r.u64("serverTime"))
        case .message:
            let messageID = try r.identifier("messageId")
            let sender = try r.identifier("sender")
            let senderDevice = try r.identifier("senderDevice")
            let recipient = try r.identifier("recipient")
            let contentType = try r.text("contentType", minBytes: 1, maxBytes: ProtocolLimits.maxShortTextBytes)
            let serverTime = try r.u64("serverTime")
            let body = try r.blob("body")
            return .message(DeliveredMessage(
                messageID: messageID, sender: sender, senderDevice: senderDevice, recipient: recipient,
                contentType: contentType, body: body, serverTime: serverTime))
        case .messageDelivered:
            return .messageDelivered(
                messageID: try r.identifier("messageId"), recipient: try r.identifier("recipient"),
                recipientDevice: try r.identifier("recipientDevice"), serverTime: try r.u64("serverTime"))
        default:
            preconditionFailure("not an event type: \(type)")
        }
    }
}
