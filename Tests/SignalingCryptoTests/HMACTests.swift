import Testing
@testable import SignalingCrypto

@Suite("HMAC-SHA256, constant-time comparison and random bytes through libcrypto")
struct HMACTests {
    private func hex(_ bytes: [UInt8]) -> String {
        bytes.map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined()
    }

    @Test("HMAC-SHA256 matches RFC 4231 test cases 1, 2 and 6")
    func rfc4231() throws {
        #expect(hex(try HMACSHA256.authenticate(Array("Hi There".utf8), key: [UInt8](repeating: 0x0b, count: 20)))
            == "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7")
        #expect(hex(try HMACSHA256.authenticate(Array("what do ya want for nothing?".utf8), key: Array("Jefe".utf8)))
            == "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843")
        // A key longer than the block is hashed first.
        #expect(hex(try HMACSHA256.authenticate(
            Array("Test Using Larger Than Block-Size Key - Hash Key First".utf8), key: [UInt8](repeating: 0xaa, count: 131)))
            == "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54")
    }

    @Test("a prepared key gives the same MAC every time, from several threads at once")
    func preparedKeyIsReusable() async throws {
        let key = try HMACSHA256.Key(Array("Jefe".utf8))
        let message = Array("what do ya want for nothing?".utf8)
        let expected = try HMACSHA256.authenticate(message, key: Array("Jefe".utf8))
        let results = await withTaskGroup(of: Bool.self) { group in
            for _ in 0..<8 {
                group.addTask { (0..<500).allSatisfy { _ in (try? key.authenticate(message)) == expected } }
            }
            return await group.reduce(into: [Bool]()) { $0.append($1) }
        }
        #expect(results == Array(repeating: true, count: 8))
        #expect(try key.authenticate(ArraySlice(message)) == expected)
    }

    @Test("an empty key is refused instead of silently reusing another")
    func emptyKeyIsRefused() {
        #expect(throws: CryptoError.self) { try HMACSHA256.Key([]) }
    }

    @Test("constant-time equality compares contents and lengths")
    func constantTimeEquality() {
        #expect(ConstantTime.equal([1, 2, 3], [1, 2, 3]))
        #expect(!ConstantTime.equal([1, 2, 3], [1, 2, 4]))
        #expect(!ConstantTime.equal([1, 2, 3], [1, 2]))
        #expect(ConstantTime.equal([], []))
    }

    @Test("random bytes are the length asked for and differ between calls")
    func randomBytes() throws {
        let a = try SecureRandom.bytes(32), b = try SecureRandom.bytes(32)
        #expect(a.count == 32 && b.count == 32 && a != b)
        #expect(try SecureRandom.bytes(0).isEmpty)
    }

    @Test("base64url round-trips every length and refuses padding and foreign characters")
    func base64url() {
        for length in 0..<20 {
            let bytes = (0..<length).map { UInt8(truncatingIfNeeded: $0 &* 37 &+ 250) }
            let text = Base64URL.encode(bytes)
            #expect(!text.contains("=") && !text.contains("+") && !text.contains("/"))
            #expect(Base64URL.decode(Array(text.utf8)) == bytes)
        }
        #expect(Base64URL.encode(Array("hello?>".utf8)) == "aGVsbG8_Pg")
        #expect(Base64URL.decode(Array("aGVsbG8=".utf8)) == nil)
        #expect(Base64URL.decode(Array("a+b/".utf8)) == nil)
        #expect(Base64URL.decode(Array("abcde".utf8)) == nil)
    }
}
