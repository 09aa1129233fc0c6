/// The few MQTT 3.1.1 control packets the probe sends and reads (OASIS MQTT 3.1.1, ch. 2–3).
enum MQTTPackets {
    static let connack: UInt8 = 2
    static let publish: UInt8 = 3
    static let suback: UInt8 = 9
    static let pingresp: UInt8 = 13

    /// CONNECT: protocol "MQTT" level 4, clean session, no will, no user name or password.
    static func connect(clientID: String, keepAliveSeconds: UInt16) -> [UInt8] {
        var body: [UInt8] = []
        appendString("MQTT", to: &body)
        body.append(4)  // protocol level: 3.1.1
        body.append(0x02)  // connect flags: clean session
        appendU16(keepAliveSeconds, to: &body)
        appendString(clientID, to: &body)
        return packet(0x10, body)
    }

    /// SUBSCRIBE to one topic filter at QoS 0.
    static func subscribe(packetID: UInt16, topic: String) -> [UInt8] {
        var body: [UInt8] = []
        appendU16(packetID, to: &body)
        appendString(topic, to: &body)
        body.append(0)  // requested QoS
        return packet(0x82, body)  // flags 0010 are mandatory for SUBSCRIBE
    }

    /// PUBLISH at QoS 0 (no packet identifier); the payload ends the packet.
    static func publish(topic: String, payload: [UInt8]) -> [UInt8] {
        var body: [UInt8] = []
        body.reserveCapacity(2 + topic.utf8.count + payload.count)
        appendString(topic, to: &body)
        body.append(contentsOf: payload)
        return packet(0x30, body)
    }

    /// The packet at the start of `bytes`, once complete: its type (high nibble of the first
    /// byte), flags (low nibble), where its variable header starts and its total size.
    static func next(_ bytes: UnsafeRawBufferPointer) throws(ProbeError)
        -> (type: UInt8, flags: UInt8, bodyStart: Int, size: Int)?
    {
        guard bytes.count >= 2 else { return nil }
        var remaining = 0
        var index = 1
        while true {
            guard index < bytes.count else { return nil }
            guard index <= 4 else { throw ProbeError("MQTT: malformed remaining length") }
            let byte = bytes[index]
            remaining |= Int(byte & 0x7F) << (7 * (index - 1))
            index += 1
            if byte & 0x80 == 0 { break }
        }
        guard bytes.count >= index + remaining else { return nil }
        return (bytes[0] >> 4, bytes[0] & 0x0F, index, index + remaining)
    }

    private static func packet(_ firstByte: UInt8, _ body: [UInt8]) -> [UInt8] {
        var out: [UInt8] = [firstByte]
        var length = body.count
        repeat {  // remaining length: 7 bits a byte, least significant first
            var byte = UInt8(length & 0x7F)
            length >>= 7
            if length > 0 { byte |= 0x80 }
            out.append(byte)
        } while length > 0
        out.append(contentsOf: body)
        return out
    }

    private static func appendU16(_ value: UInt16, to out: inout [UInt8]) {
        out.append(UInt8(value >> 8))
        out.append(UInt8(value & 0xFF))
    }

    private static func appendString(_ text: String, to out: inout [UInt8]) {
        appendU16(UInt16(text.utf8.count), to: &out)
        out.append(contentsOf: text.utf8)
    }
}
