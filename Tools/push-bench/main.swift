// push-bench: 10,000 wake-ups through the APNs provider to the local HTTP/2 mock
// (Tools/mock-push-service.py, TLS under a throw-away CA), all over one connection.
// Prints requests/s, the latency from `submit` (the server's event) to the request
// arriving complete at the mock (p50/p99; both clocks are CLOCK_MONOTONIC), the
// connections used, and the push thread's CPU time per wake-up. docs/PUSH.md has figures.
//     swift build -c release --product push-bench && .build/release/push-bench [wake-ups]
import Foundation
import SignalingCrypto
import SignalingPush
import SignalingStore
import SignalingSupport
import TestSupport

let count = CommandLine.arguments.dropFirst().first.flatMap { Int($0) } ?? 10_000
let pki = try PushTestPKI()
let mock = try MockPushService(pki: pki, logName: "bench.log")
var configuration = PushGatewayConfiguration()
var apns = APNsConfiguration(
    key: try JWTSigningKey(pem: String(contentsOfFile: pki.apnsKeyFile, encoding: .utf8)),
    keyID: PushTestPKI.apnsKeyID, teamID: PushTestPKI.apnsTeamID, defaultTopic: "com.example.app")
apns.productionURL = mock.baseURL
configuration.apns = apns
configuration.caFile = pki.caFile
configuration.minimumInterval = .zero
configuration.requestTimeout = .seconds(60)
configuration.maxQueuedDevices = max(100_000, count * 2)
// Second argument: streams in flight at once (default 100, as the server's --push-streams).
configuration.maxConcurrentStreams = CommandLine.arguments.dropFirst(2).first.flatMap { Int($0) } ?? 100
let gateway = try PushGateway(configuration: configuration, logger: .silent)
try gateway.start()

// One warm-up push opens the connection and signs the provider token, as a running server
// has long done before the measured burst.
let token = [UInt8](repeating: 0x5A, count: 32)
func wakeUp(_ device: String) -> WakeUp {
    WakeUp(userID: "user", deviceID: device, registrations: [PushRegistration(platform: "apns", token: token)], kind: .message,
           pendingEvents: 1, conversation: "alice")
}
gateway.submit(wakeUp("warm-up"))
try mock.waitFor("the warm-up push", timeout: 30) { $0.count == 1 }

func cpuSeconds() -> Double {
    var usage = rusage()
    getrusage(RUSAGE_SELF.rawValue, &usage)
    return Double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) + Double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6
}

let clock = SystemClock()
var submittedAt = [UInt64](repeating: 0, count: count)
let cpuBefore = cpuSeconds()
let start = clock.now()
for index in 0..<count {
    submittedAt[index] = clock.now().nanoseconds
    gateway.submit(wakeUp("d\(index)"))
}
let deadline = clock.now() + .seconds(600)
while gateway.statistics.sent + gateway.statistics.dropped + gateway.statistics.rejected < count + 1 {
    guard clock.now() < deadline else { fatalError("not done after 600 s: \(gateway.statistics)") }
    usleep(2_000)
}
let elapsed = (clock.now() - start).seconds
let cpu = cpuSeconds() - cpuBefore
let requests = mock.requests.dropFirst()
let latencies = requests.compactMap { request -> Double? in
    guard let device = (request.json["vs"] as? [String: Any])?["device"] as? String, let index = Int(device.dropFirst()) else { return nil }
    return Double(request.receivedAt &- submittedAt[index]) / 1e6
}.sorted()
func percentile(_ values: [Double], _ p: Double) -> Double { values.isEmpty ? .nan : values[min(values.count - 1, Int(Double(values.count) * p))] }
let last = requests.map(\.receivedAt).max() ?? start.nanoseconds
print("wake-ups        \(count) (sent \(gateway.statistics.sent - 1), failed attempts \(gateway.statistics.failedAttempts))")
print("connections     \(mock.connectionCount)")
print(String(format: "requests/s      %.0f (submit of the first to the last at the mock: %.2f s)", Double(count) / (Double(last - start.nanoseconds) / 1e9), Double(last - start.nanoseconds) / 1e9))
print(String(format: "event -> mock   p50 %.1f ms  p99 %.1f ms  max %.1f ms", percentile(latencies, 0.5), percentile(latencies, 0.99), latencies.last ?? .nan))
print(String(format: "client CPU      %.1f µs per wake-up (%.2f s CPU in %.2f s; the push thread, with TLS and HTTP/2)", cpu / Double(count) * 1e6, cpu, elapsed))
gateway.stop()
mock.stop()
