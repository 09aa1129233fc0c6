import CLinuxShims
import SignalingProtocol

/// The VSIG protocol (docs/PROTOCOL.md): subscriber i is user "u<i>" device "d1"; the
/// publisher is user "sender" device "p1" and sends MESSAGE_SEND to "u<i>". Both acknowledge
/// every event they receive, as a real device does (subscribers their MESSAGE events, the
/// publisher the MESSAGE_DELIVERED receipts those ACKs cause).
struct VoipDialect: Dialect {
    static let contentType = "application/x-probe"
    /// Server frames may exceed the announced maximum by what the server adds (PROTOCOL.md 2).
    private let decoder = FrameDecoder(maxFrameLength: ProtocolLimits.defaultMaxFrameLength + 4096)
    /// Part of every message id: the server drops a message whose (sender, messageId) it
    /// has seen (PROTOCOL.md), so a second run against the same server needs new ids.
    private let run = String(voipload_realtime_ns(), radix: 36)

    func subscriberGreeting(_ subscriber: Int) -> [UInt8] {
        FrameEncoder.encode(.hello(Hello(userID: "u\(subscriber)", deviceID: "d1")))
    }

    func publisherGreeting() -> [UInt8] {
        FrameEncoder.encode(.hello(Hello(userID: "sender", deviceID: "p1")))
    }

    func publication(number: Int, subscriber: Int, payload: [UInt8]) -> [UInt8] {
        let message = OutgoingMessage(
            messageID: "m\(run)-\(number)", recipient: "u\(subscriber)", contentType: Self.contentType, body: payload)
        return FrameEncoder.encode(.request(id: UInt32(truncatingIfNeeded: number + 1), .messageSend(message)))
    }

    func consume(_ bytes: UnsafeRawBufferPointer, subscriber: Int?, into inbound: inout Inbound) -> Int {
        var offset = 0
        var acknowledge: UInt64 = 0
        while inbound.problem == nil {
            let frame: Frame
            do {
                guard let (next, size) = try decoder.decode(UnsafeRawBufferPointer(rebasing: bytes[offset...])) else { break }
                frame = next
                offset += size
            } catch {
                inbound.problem = "protocol violation from the server: \(error)"
                break
            }
            switch frame {
            case .welcome:
                inbound.established = true
            case .event(let seq, let event):
                acknowledge = max(acknowledge, seq)
                if case .message(let message) = event {
                    received(message, subscriber: subscriber, into: &inbound)
                }
            case .ok:
                inbound.oks += 1
            case .error(_, let code, let message):
                inbound.errors += 1
                inbound.lastError = "\(code): \(message)"
            case .close(let close):
                inbound.problem = "CLOSE \(close.code): \(close.message)"
            case .ping:
                FrameEncoder.append(.pong, to: &inbound.reply)
            case .pong:
                break
            default:
                inbound.problem = "unexpected \(frame.type) frame from the server"
            }
        }
        if acknowledge > 0 { FrameEncoder.append(.ack(seq: acknowledge), to: &inbound.reply) }
        return offset
    }

    private func received(_ message: DeliveredMessage, subscriber: Int?, into inbound: inout Inbound) {
        guard let stamp = message.body.withUnsafeBytes({ sendStamp($0) }) else {
            inbound.problem = "MESSAGE too short for a send stamp"
            return
        }
        if let subscriber, message.recipient != "u\(subscriber)" { inbound.misrouted += 1 }
        inbound.stamps.append(stamp)
    }
}
