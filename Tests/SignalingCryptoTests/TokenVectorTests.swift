import Foundation
import SignalingCrypto
import SignalingProtocol
@testable import SignalingServer
import Testing

/// docs/AUTH.md's test vectors, read from the page itself: the specification a backend
/// implements and the code cannot drift apart.
@Suite("docs/AUTH.md test vectors")
struct TokenVectorTests {
    static var documentLines: [String] {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let text = (try? String(contentsOf: root.appendingPathComponent("docs/AUTH.md"), encoding: .utf8)) ?? ""
        guard let start = text.range(of: "```test-vectors\n"),
              let end = text.range(of: "\n```", range: start.upperBound..<text.endIndex)
        else { return [] }
        return text[start.upperBound..<end.lowerBound].split(separator: "\n").map(String.init)
    }

    @Test("every vector of docs/AUTH.md holds: minted tokens match byte for byte, and each HELLO gets the verdict written")
    func vectors() throws {
        let lines = Self.documentLines
        var keys: [TokenKey] = []
        var mints = 0, verifications = 0
        for line in lines {
            let fields = line.split(separator: " ").map(String.init)
            if fields.first == "key" {
                keys.append(try TokenKey(id: fields[1], secret: Array(fields[2].utf8)))
            }
        }
        let verifier = try TokenVerifier(keys: keys)
        for line in lines {
            let fields = line.split(separator: " ").map(String.init)
            switch fields.first {
            case "mint":
                guard fields.count == 6, let key = keys.first(where: { $0.id == fields[1] }), let expiry = Int64(fields[4]) else {
                    Issue.record("bad mint line: \(line)"); continue
                }
                let claims = DeviceTokenClaims(userID: fields[2], deviceID: fields[3] == "-" ? nil : fields[3], expiresAt: expiry)
                #expect(try DeviceToken.mint(claims, key: key) == fields[5], "\(line)")
                mints += 1
            case "verify":
                guard fields.count == 6, let now = Int64(fields[4]) else { Issue.record("bad verify line: \(line)"); continue }
                let verdict = verifier.verify(Array(fields[1].utf8), userID: fields[2], deviceID: fields[3], now: now)
                let result = Authentication.refusal(for: verdict, userID: fields[2]).map { "\($0.close.code)" } ?? "accepted"
                #expect(result == fields[5], "\(line): \(verdict)")
                verifications += 1
            default:
                break
            }
        }
        #expect(keys.count == 2 && mints == 3 && verifications >= 12, "the vectors block was not found or is incomplete")
    }
}
