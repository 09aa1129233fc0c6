import SignalingStore
/// The request body the gateway receives (docs/PUSH.md has the schema):
///
///     {"id":"5f3a91c2.17","user":"bob","device":"phone","kind":"call","pending":3,
///      "platform":"apns","token":"9a0f…","tokenEncoding":"hex","attempt":1}
///
/// Hand-written rather than `JSONEncoder`: the field order is fixed, there is nothing to
/// reflect over, and the bytes are built once per attempt on the gateway's thread.
enum WakeUpJSON {
    /// How the token is written: as text when the bytes are printable UTF-8 (FCM tokens
    /// are), as lowercase hex otherwise (APNs device tokens are 32 raw bytes).
    enum TokenEncoding: String {
        case text
        case hex
    }

    /// The body for `wakeUp` with its first registration (a device with one).
    static func body(_ wakeUp: WakeUp, id: String, attempt: Int) -> [UInt8] {
        body(wakeUp, registration: wakeUp.registrations.first ?? PushRegistration(platform: "", token: []), id: id, attempt: attempt)
    }

    /// The body for `wakeUp` sent with `registration` (the one `PushRouting` chose).
    static func body(_ wakeUp: WakeUp, registration: PushRegistration, id: String, attempt: Int) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(160 + registration.token.count * 2)
        out += #"{"id":"#.utf8
        appendString(id, to: &out)
        out += #","user":"#.utf8
        appendString(wakeUp.userID, to: &out)
        out += #","device":"#.utf8
        appendString(wakeUp.deviceID, to: &out)
        out += #","kind":"#.utf8
        appendString(wakeUp.kind.rawValue, to: &out)
        out += #","pending":"#.utf8
        out += String(max(0, wakeUp.pendingEvents)).utf8
        out += #","platform":"#.utf8
        appendString(registration.platform, to: &out)
        out += #","token":"#.utf8
        let token = registration.token
        let encoding = tokenEncoding(token)
        switch encoding {
        case .text: appendString(String(decoding: token, as: UTF8.self), to: &out)
        case .hex: appendHex(token, to: &out)
        }
        out += #","tokenEncoding":"#.utf8
        appendString(encoding.rawValue, to: &out)
        out += #","attempt":"#.utf8
        out += String(attempt).utf8
        out.append(UInt8(ascii: "}"))
        return out
    }

    /// Text when the token is non-empty, valid UTF-8 and has no control characters (C0,
    /// DEL, C1): such a token survives any JSON consumer and log line unchanged.
    static func tokenEncoding(_ token: [UInt8]) -> TokenEncoding {
        guard !token.isEmpty else { return .hex }
        var iterator = token.makeIterator()
        var decoder = UTF8()
        while true {
            switch decoder.decode(&iterator) {
            case .scalarValue(let scalar):
                let value = scalar.value
                if value < 0x20 || (0x7F...0x9F).contains(value) { return .hex }
            case .emptyInput:
                return .text
            case .error:
                return .hex
            }
        }
    }

    /// A JSON string literal (RFC 8259): quote, backslash and control characters escaped;
    /// everything else is copied as UTF-8.
    static func appendString(_ value: String, to out: inout [UInt8]) {
        out.append(UInt8(ascii: "\""))
        for byte in value.utf8 {
            switch byte {
            case UInt8(ascii: "\""): out += #"\""#.utf8
            case UInt8(ascii: "\\"): out += #"\\"#.utf8
            case 0x0A: out += #"\n"#.utf8
            case 0x0D: out += #"\r"#.utf8
            case 0x09: out += #"\t"#.utf8
            case 0x08: out += #"\b"#.utf8
            case 0x0C: out += #"\f"#.utf8
            case 0..<0x20:
                out += #"\u00"#.utf8
                out.append(hexDigit(byte >> 4))
                out.append(hexDigit(byte & 0x0F))
            default: out.append(byte)
            }
        }
        out.append(UInt8(ascii: "\""))
    }

    static func appendHex(_ bytes: [UInt8], to out: inout [UInt8]) {
        out.append(UInt8(ascii: "\""))
        for byte in bytes {
            out.append(hexDigit(byte >> 4))
            out.append(hexDigit(byte & 0x0F))
        }
        out.append(UInt8(ascii: "\""))
    }

    private static func hexDigit(_ nibble: UInt8) -> UInt8 {
        nibble < 10 ? UInt8(ascii: "0") + nibble : UInt8(ascii: "a") + nibble - 10
    }
}
