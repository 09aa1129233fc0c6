import SignalingProtocol

/// One or more instances of every frame type, with awkward values (empty blobs, non-ASCII
/// text, extreme integers) so round-trips exercise every field encoding.
enum SampleFrames {
    static let session = SessionID(high: 0x0123_4567_89ab_cdef, low: .max)

    static let all: [Frame] = [
        .hello(Hello(userID: "alice", deviceID: "phone-1")),
        .hello(Hello(
            userID: "ünïcødé-user", deviceID: "d", credentials: Array("token".utf8),
            resume: ResumePoint(sessionID: session, lastReceivedSeq: 42), requestedKeepAliveSeconds: 900)),
        .hello(Hello(userID: "bob", deviceID: "tablet", credentials: [], requestedKeepAliveSeconds: 600)),
        .welcome(Welcome(
            sessionID: session, resumed: true, keepAliveSeconds: 600, idleTimeoutSeconds: 900,
            serverTime: 1_790_000_000_000, maxFrameLength: 65536, ackedSeq: 41, lastSeq: .max)),
        .welcome(Welcome(
            sessionID: SessionID(high: 0, low: 0), resumed: false, keepAliveSeconds: 3600,
            idleTimeoutSeconds: 5400, serverTime: 0, maxFrameLength: 1, ackedSeq: 0)),
        .ping,
        .pong,
        .ack(seq: 0),
        .ack(seq: .max),
        .close(Close(code: .goingAway, retryAfterMs: 1000, retryJitterMs: 30000, message: "restarting")),
        .close(Close(code: .replaced, message: "")),
        .request(id: 1, .callInvite(callID: "c1", callee: "bob", offer: Array("v=0 sdp".utf8))),
        .request(id: .max, .callInvite(callID: "c2", callee: "bob", offer: [])),
        .request(id: 2, .callRinging(callID: "c1")),
        .request(id: 3, .callAccept(callID: "c1", answer: [0, 1, 2, 255])),
        .request(id: 4, .callReject(callID: "c1", reason: .declined)),
        .request(id: 5, .callReject(callID: "c1", reason: .busy)),
        .request(id: 6, .callCancel(callID: "c1")),
        .request(id: 7, .callHangup(callID: "c1")),
        .request(id: 8, .messageSend(OutgoingMessage(
            messageID: "m-1", recipient: "bob", contentType: "text/plain", body: Array("héllo".utf8)))),
        .request(id: 9, .messageSend(OutgoingMessage(messageID: "m-2", recipient: "bob", contentType: "x", body: []))),
        .request(id: 10, .pushRegister(platform: "apns", token: [1, 2, 3])),
        .request(id: 11, .pushRegister(platform: "apns-voip", token: [0xAB], environment: "sandbox")),
        .request(id: 12, .pushRegister(
            platform: "apns-voip", token: [1, 2], environment: "production", topic: "com.example.voip")),
        .request(id: 13, .pushRegister(platform: "fcm", token: [], environment: "", topic: "ünï")),
        .ok(requestID: 8, serverTime: 123),
        .error(requestID: 9, code: .unknownCall, message: "no call c9"),
        .error(requestID: 0, code: .storeUnavailable, message: ""),
        .event(seq: 1, .callIncoming(callID: "c1", caller: "alice", callerDevice: "phone-1", offer: [9, 9], serverTime: 77)),
        .event(seq: 2, .callRang(callID: "c1", device: "tablet")),
        .event(seq: 3, .callAccepted(callID: "c1", device: "tablet", answer: Array("answer".utf8))),
        .event(seq: 4, .callEnded(callID: "c1", reason: .answeredElsewhere, peer: "alice", serverTime: 5)),
        .event(seq: .max, .message(DeliveredMessage(
            messageID: "m-1", sender: "alice", senderDevice: "phone-1", recipient: "bob",
            contentType: "application/json", body: Array(#"{"a":1}"#.utf8), serverTime: 99))),
        .event(seq: 6, .messageDelivered(messageID: "m-1", recipient: "bob", recipientDevice: "tablet", serverTime: 100)),
    ]

    /// The frames a sample's encoding ends as when it is cut exactly before one of its
    /// optional trailing fields: such a cut is a valid, shorter frame, not a truncation.
    static func shorterForms(of frame: Frame) -> [Frame] {
        guard case .request(let id, .pushRegister(let platform, let token, let environment, let topic)) = frame
        else { return [] }
        var forms: [Frame] = []
        if environment != nil { forms.append(.request(id: id, .pushRegister(platform: platform, token: token))) }
        if topic != nil {
            forms.append(.request(id: id, .pushRegister(platform: platform, token: token, environment: environment ?? "")))
        }
        return forms
    }
}
