import Testing
@testable import SignalingProtocol

@Suite("SHA-256 and tokens")
struct AuthTokenTests {
    private func hex(_ bytes: [UInt8]) -> String {
        bytes.map { String($0, radix: 16).count == 1 ? "0" + String($0, radix: 16) : String($0, radix: 16) }.joined()
    }

    @Test("SHA-256 matches FIPS 180-4 vectors")
    func sha256Vectors() {
        #expect(hex(SHA256.hash([])) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
        #expect(hex(SHA256.hash(Array("abc".utf8))) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        #expect(hex(SHA256.hash(Array("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq".utf8)))
            == "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1")
    }

    @Test("SHA-256 of long and oddly split input (a million 'a', and updates of every size)")
    func sha256Incremental() {
        #expect(hex(SHA256.hash([UInt8](repeating: 0x61, count: 1_000_000)))
            == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0")
        let message = (0..<300).map { UInt8(truncatingIfNeeded: $0 &* 7) }
        let whole = SHA256.hash(message)
        for chunk in [1, 3, 55, 56, 63, 64, 65, 128, 299] {
            var hasher = SHA256.Hasher256()
            var offset = 0
            while offset < message.count {
                let end = min(message.count, offset + chunk)
                hasher.update(Array(message[offset..<end]))
                offset = end
            }
            #expect(hasher.finalize() == whole, "chunks of \(chunk)")
        }
    }

    @Test("finishing with appended bytes equals updating with them first, at every length around the block edges")
    func finalizeAppending() {
        let message = (0..<200).map { UInt8(truncatingIfNeeded: $0 &* 13 &+ 5) }
        for pendingCount in [0, 1, 30, 55, 56, 63] {
            for appended in [0, 1, 8, 54, 55, 56, 57, 63, 64, 65, 70, 119, 120, 137] {
                var split = SHA256.Hasher256()
                split.update(Array(message[..<pendingCount]))
                let appendedDigest = split.finalize(appending: Array(message[pendingCount..<(pendingCount + appended)]))
                #expect(appendedDigest == SHA256.hash(Array(message[..<(pendingCount + appended)])),
                        "\(pendingCount) pending, \(appended) appended")
            }
        }
    }

    @Test("HMAC-SHA256 matches RFC 4231 test cases 2 and 6")
    func hmacVectors() {
        #expect(hex(SHA256.hmac(key: Array("Jefe".utf8), message: Array("what do ya want for nothing?".utf8)))
            == "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843")
        let longKey = [UInt8](repeating: 0xaa, count: 131)
        let message = Array("Test Using Larger Than Block-Size Key - Hash Key First".utf8)
        #expect(hex(SHA256.hmac(key: longKey, message: message))
            == "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54")
    }

    @Test("hex digits of every nibble, and tokens are lowercase hex of the MAC")
    func hexDigits() {
        #expect((0...15).map { AuthToken.hexDigit(UInt8($0)) } == Array("0123456789abcdef".utf8))
        let mac = SHA256.hmac(key: Array("s3cret".utf8), message: Array("alice".utf8))
        #expect(AuthToken.make(secret: "s3cret", userID: "alice") == Array(hex(mac).utf8))
        // A token that differs in its last digit only is refused.
        var token = AuthToken.make(secret: "s3cret", userID: "alice")
        token[63] = token[63] == UInt8(ascii: "0") ? UInt8(ascii: "1") : UInt8(ascii: "0")
        #expect(!AuthToken.verify(token, secret: "s3cret", userID: "alice"))
    }

    @Test("tokens verify for their user only")
    func tokens() {
        let token = AuthToken.make(secret: "s3cret", userID: "alice")
        #expect(token.count == 64)
        #expect(AuthToken.verify(token, secret: "s3cret", userID: "alice"))
        #expect(!AuthToken.verify(token, secret: "s3cret", userID: "bob"))
        #expect(!AuthToken.verify(token, secret: "other", userID: "alice"))
        #expect(!AuthToken.verify(Array(token.dropLast()), secret: "s3cret", userID: "alice"))
        let key = AuthToken.key(secret: "s3cret")
        #expect(AuthToken.make(key: key, userID: "alice") == token)
        #expect(AuthToken.verify(token, key: key, userID: "alice"))
    }
}
