/// MQTT 3.1.1: subscriber i is client "s<i>" subscribed to "d/<i>" at QoS 0; the publisher
/// is client "pub" and publishes at QoS 0.
struct MQTTDialect: Dialect {
    static let keepAliveSeconds: UInt16 = 600

    func subscriberGreeting(_ subscriber: Int) -> [UInt8] {
        MQTTPackets.connect(clientID: "s\(subscriber)", keepAliveSeconds: Self.keepAliveSeconds)
    }

    func publisherGreeting() -> [UInt8] {
        MQTTPackets.connect(clientID: "pub", keepAliveSeconds: Self.keepAliveSeconds)
    }

    func publication(number: Int, subscriber: Int, payload: [UInt8]) -> [UInt8] {
        MQTTPackets.publish(topic: "d/\(subscriber)", payload: payload)
    }

    func consume(_ bytes: UnsafeRawBufferPointer, subscriber: Int?, into inbound: inout Inbound) -> Int {
        var offset = 0
        while inbound.problem == nil {
            let packet: (type: UInt8, flags: UInt8, bodyStart: Int, size: Int)
            do {
                guard let next = try MQTTPackets.next(UnsafeRawBufferPointer(rebasing: bytes[offset...])) else { break }
                packet = next
            } catch {
                inbound.problem = error.message
                break
            }
            let body = UnsafeRawBufferPointer(rebasing: bytes[(offset + packet.bodyStart)..<(offset + packet.size)])
            offset += packet.size
            switch packet.type {
            case MQTTPackets.connack:
                guard body.count >= 2, body[1] == 0 else {
                    inbound.problem = "CONNACK refused the connection (return code \(body.count >= 2 ? Int(body[1]) : -1))"
                    break
                }
                if let subscriber {
                    inbound.reply += MQTTPackets.subscribe(packetID: 1, topic: "d/\(subscriber)")
                } else {
                    inbound.established = true
                }
            case MQTTPackets.suback:
                guard body.count >= 3, body[2] != 0x80 else {
                    inbound.problem = "SUBACK refused the subscription"
                    break
                }
                inbound.established = true
            case MQTTPackets.publish:
                publication(body, qos: (packet.flags >> 1) & 3, subscriber: subscriber, into: &inbound)
            case MQTTPackets.pingresp:
                break
            default:
                inbound.problem = "unexpected MQTT packet type \(packet.type)"
            }
        }
        return offset
    }

    private func publication(_ body: UnsafeRawBufferPointer, qos: UInt8, subscriber: Int?, into inbound: inout Inbound) {
        guard body.count >= 2 else { inbound.problem = "PUBLISH without a topic"; return }
        let topicLength = Int(body[0]) << 8 | Int(body[1])
        let payloadStart = 2 + topicLength + (qos > 0 ? 2 : 0)
        guard body.count >= payloadStart, let stamp = sendStamp(UnsafeRawBufferPointer(rebasing: body[payloadStart...])) else {
            inbound.problem = "PUBLISH too short for a send stamp"
            return
        }
        if let subscriber, Self.subscriber(inTopic: UnsafeRawBufferPointer(rebasing: body[2..<(2 + topicLength)])) != subscriber {
            inbound.misrouted += 1
        }
        inbound.stamps.append(stamp)
    }

    /// i for a topic "d/<i>", else nil.
    private static func subscriber(inTopic topic: UnsafeRawBufferPointer) -> Int? {
        guard topic.count >= 3, topic[0] == UInt8(ascii: "d"), topic[1] == UInt8(ascii: "/") else { return nil }
        var value = 0
        for byte in topic[2...] {
            guard byte >= UInt8(ascii: "0"), byte <= UInt8(ascii: "9"), value < Int.max / 10 - 10 else { return nil }
            value = value * 10 + Int(byte - UInt8(ascii: "0"))
        }
        return value
    }
}
