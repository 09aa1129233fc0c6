// token-bench: what checking a HELLO's credentials costs the server, per core. Prints the
// time per verification and verifications per second, single thread, for a device token
// (docs/AUTH.md) and a legacy --auth-secret token. Build with -c release:
//     swift build -c release --product token-bench && .build/release/token-bench [iterations]
import Foundation
import SignalingCrypto
import SignalingSupport

let iterations = CommandLine.arguments.dropFirst().first.flatMap { Int($0) } ?? 200_000
let key = try TokenKey(id: "k2026a", secret: Array("4f1c2a8e9b7d3c6f0e5a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60".utf8))
let other = try TokenKey(id: "k2025", secret: Array("00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff".utf8))
let verifier = try TokenVerifier(keys: [other, key], legacySecret: "legacy-secret-of-the-first-version")
let now: Int64 = 1_800_000_000
let token = Array(try DeviceToken.mint(
    DeviceTokenClaims(userID: "user-000123456", deviceID: "phone-1", expiresAt: now + 86_400), key: key).utf8)
let preparedKey = try HMACSHA256.Key(key.secret)
let legacy = try LegacyToken.make(secret: "legacy-secret-of-the-first-version", userID: "user-000123456")

func measure(_ name: String, _ body: () -> Bool) {
    for _ in 0..<(iterations / 10) where !body() { fatalError("\(name): refused") }  // warm-up
    let clock = SystemClock()
    let start = clock.now()
    for _ in 0..<iterations where !body() { fatalError("\(name): refused") }
    let seconds = (clock.now() - start).seconds
    let perCheck = seconds / Double(iterations) * 1e9
    print("\(name)  \(String(format: "%7.0f", perCheck)) ns/check  \(String(format: "%9.0f", Double(iterations) / seconds)) checks/s (one core, \(iterations) checks)")
}

measure("device token (v1)    ") { verifier.verify(token, userID: "user-000123456", deviceID: "phone-1", now: now) == .accepted(expiresAt: now + 86_400) }
measure("legacy --auth-secret ") { verifier.verify(legacy, userID: "user-000123456", deviceID: "phone-1", now: now) == .accepted(expiresAt: nil) }
measure("mint (v1, prepared)  ") { !((try? DeviceToken.mint(DeviceTokenClaims(userID: "user-000123456", deviceID: "phone-1", expiresAt: now), keyID: "k", key: preparedKey)) ?? "").isEmpty }
