import SignalingCrypto
import SignalingProtocol
@testable import SignalingServer
import SignalingSupport
import Testing

@Suite("Device token format, key files and the mint command")
struct DeviceTokenFormatTests {
    let key = try! TokenKey(id: "k1", secret: Array("0123456789abcdef0123456789abcdef".utf8))

    @Test("minting refuses what the format cannot carry")
    func mintRefusesBadClaims() {
        let cases: [(DeviceTokenClaims, String)] = [
            (DeviceTokenClaims(userID: "", deviceID: nil, expiresAt: 1), "user id"),
            (DeviceTokenClaims(userID: "a\nb", deviceID: nil, expiresAt: 1), "user id"),
            (DeviceTokenClaims(userID: String(repeating: "u", count: 129), deviceID: nil, expiresAt: 1), "user id"),
            (DeviceTokenClaims(userID: "alice", deviceID: "", expiresAt: 1), "device id"),
            (DeviceTokenClaims(userID: "alice", deviceID: "x\u{7f}", expiresAt: 1), "device id"),
            (DeviceTokenClaims(userID: "alice", deviceID: nil, expiresAt: -1), "expiry"),
        ]
        for (claims, what) in cases {
            #expect(throws: CryptoError.self, "\(what)") { try DeviceToken.mint(claims, key: key) }
        }
        #expect(throws: CryptoError.self) { try TokenKey(id: "has.dot", secret: Array(repeating: 0x61, count: 32)) }
        #expect(throws: CryptoError.self) { try TokenKey(id: "short", secret: Array(repeating: 0x61, count: 31)) }
    }

    @Test("a payload with leading zeros, a sign, four lines or bad UTF-8 is refused even under a valid MAC")
    func strictPayload() throws {
        let verifier = try TokenVerifier(keys: [key])
        let hmac = try HMACSHA256.Key(key.secret)
        for payload in ["alice\n\n0100", "alice\n\n+100", "alice\n\n100\nextra", "alice\n\n", "\n\n100", "alice\n\n99999999999999999999"] {
            let signed = "v1.k1." + Base64URL.encode(Array(payload.utf8))
            let token = signed + "." + Base64URL.encode(try hmac.authenticate(Array(signed.utf8)))
            #expect(verifier.verify(Array(token.utf8), userID: "alice", deviceID: "d", now: 0) == .malformed("the signed payload breaks the format"), "\(payload)")
        }
        let signed = "v1.k1." + Base64URL.encode([0x61, 0xff, 0x0a, 0x0a, 0x31])
        let token = signed + "." + Base64URL.encode(try hmac.authenticate(Array(signed.utf8)))
        #expect(verifier.verify(Array(token.utf8), userID: "a", deviceID: "d", now: 0) == .malformed("the signed payload breaks the format"))
    }

    @Test("key files: comments, blanks, order kept; duplicates, bad lines and empty files are errors with the line")
    func keyFiles() throws {
        let keys = try TokenKeyFile.parse("""
            # keys
            old  0123456789abcdef0123456789abcdef   # retire in March

            \tnew\t0123456789abcdef0123456789abcdeX
            """)
        #expect(keys.map(\.id) == ["old", "new"])
        #expect(keys[1].secret == Array("0123456789abcdef0123456789abcdeX".utf8))
        let failures: [(String, String)] = [
            ("", "no keys"),
            ("# only a comment\n", "no keys"),
            ("k1 0123456789abcdef0123456789abcdef extra\n", "line 1: expected 'KID SECRET'"),
            ("k1\n", "line 1: expected 'KID SECRET'"),
            ("\nk1 0123456789abcdef0123456789abcdef\nk1 0123456789abcdef0123456789abcdef\n", "line 3: key id 'k1' appears twice"),
            ("k1 short\n", "line 1: the secret of key 'k1' is 5 bytes"),
        ]
        for (text, message) in failures {
            #expect(throws: CryptoError.self) { try TokenKeyFile.parse(text) }
            do {
                _ = try TokenKeyFile.parse(text)
            } catch {
                #expect(error.message.contains(message), "\(text): \(error.message)")
            }
        }
        #expect("\(keys[0])" == "TokenKey(old)", "a key prints without its secret")
    }

    @Test("--ttl durations")
    func durations() throws {
        #expect(try TokenCommand.parseDuration("90") == 90)
        #expect(try TokenCommand.parseDuration("90s") == 90)
        #expect(try TokenCommand.parseDuration("15m") == 900)
        #expect(try TokenCommand.parseDuration("24h") == 86_400)
        #expect(try TokenCommand.parseDuration("7d") == 604_800)
        for bad in ["", "0", "-5m", "+5m", "h", "1.5h", "1w", "99999999999999999d"] {
            #expect(throws: UsageError.self, "\(bad)") { try TokenCommand.parseDuration(bad) }
        }
    }

    @Test("CLOSE codes: expired and unknown key are transient and ask for fresh credentials; the others stop")
    func closeCodes() {
        #expect(CloseCode.tokenExpired.rawValue == 3009 && CloseCode.tokenExpired.defaultAction == .refreshCredentials)
        #expect(CloseCode.unknownKey.rawValue == 3010 && CloseCode.unknownKey.defaultAction == .refreshCredentials)
        #expect(CloseCode.badSignature.rawValue == 3510 && CloseCode.badSignature.defaultAction == .stop)
        #expect(CloseCode.wrongDevice.rawValue == 3511 && CloseCode.wrongDevice.defaultAction == .stop)
        #expect(ReconnectAction.refreshCredentials.rawValue == 3)
    }
}
