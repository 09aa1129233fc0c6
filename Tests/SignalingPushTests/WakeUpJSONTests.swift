import Foundation
import SignalingStore
import Testing
@testable import SignalingPush

@Suite("Wake-up JSON body")
struct WakeUpJSONTests {
    @Test("every documented field, nothing else, and a binary token as hex")
    func documentedFields() throws {
        let body = WakeUpJSON.body(wakeUp(kind: .call, pending: 3), id: "0a0b0c0d.7", attempt: 2)
        let object = try #require(jsonObject(body))
        #expect(Set(object.keys) == documentedWakeUpFields)
        #expect(object["id"] as? String == "0a0b0c0d.7")
        #expect(object["user"] as? String == "bob")
        #expect(object["device"] as? String == "phone")
        #expect(object["kind"] as? String == "call")
        #expect(object["pending"] as? Int == 3)
        #expect(object["platform"] as? String == "apns")
        #expect(object["tokenEncoding"] as? String == "hex")
        #expect(object["token"] as? String == binaryToken.map { String(format: "%02x", $0) }.joined())
        #expect(object["attempt"] as? Int == 2)
    }

    @Test("a printable UTF-8 token is sent as text")
    func textToken() throws {
        let token = "fcm:APA91b-Ünïcødé_token"
        let body = WakeUpJSON.body(wakeUp(platform: "fcm", token: Array(token.utf8)), id: "x.1", attempt: 1)
        let object = try #require(jsonObject(body))
        #expect(object["tokenEncoding"] as? String == "text")
        #expect(object["token"] as? String == token)
    }

    @Test("tokens with control bytes, invalid UTF-8 or nothing at all are hex")
    func hexTokens() {
        #expect(WakeUpJSON.tokenEncoding(Array("abc\n".utf8)) == .hex)
        #expect(WakeUpJSON.tokenEncoding([0x61, 0x7F]) == .hex)
        #expect(WakeUpJSON.tokenEncoding([0xC2, 0x85]) == .hex)  // U+0085, a C1 control
        #expect(WakeUpJSON.tokenEncoding([0xFF, 0xFE]) == .hex)
        #expect(WakeUpJSON.tokenEncoding([0xE2, 0x82]) == .hex)  // truncated sequence
        #expect(WakeUpJSON.tokenEncoding([]) == .hex)
        #expect(WakeUpJSON.tokenEncoding(Array("a b~".utf8)) == .text)
    }

    @Test("quotes, backslashes and control characters in ids are escaped and round-trip")
    func escaping() throws {
        let user = "al\"ice\\\n\t\u{01}\u{1F}é😀"
        let device = "</script>\r\u{08}\u{0C}"
        let body = WakeUpJSON.body(wakeUp(user: user, device: device, platform: "a\"b"), id: "i.1", attempt: 1)
        let text = String(decoding: body, as: UTF8.self)
        #expect(!text.contains("\n") && !text.contains("\t") && !text.contains("\u{01}"))
        #expect(text.contains(#"\u0001"#) && text.contains(#"\u001f"#))
        let object = try #require(jsonObject(body))
        #expect(object["user"] as? String == user)
        #expect(object["device"] as? String == device)
        #expect(object["platform"] as? String == "a\"b")
    }

    @Test("a negative counter is written as 0")
    func negativeCounter() throws {
        let object = try #require(jsonObject(WakeUpJSON.body(wakeUp(pending: -5), id: "i.1", attempt: 1)))
        #expect(object["pending"] as? Int == 0)
    }
}
