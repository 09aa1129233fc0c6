import Foundation
import SignalingCrypto
import SignalingProtocol
import SignalingServer
import SignalingSupport
import Synchronization
import Testing
@testable import SignalingClient

/// A token that expires is the normal course of things (docs/AUTH.md): the client asks
/// the app for a fresh one through `credentialsProvider`, and never stops for good.
@Suite("Refreshing credentials")
struct CredentialsRefreshTests {
    static let key = try! TokenKey(id: "k1", secret: Array("client-test-secret-0123456789abcdef".utf8))

    private func token(expiresIn seconds: Int64) throws -> [UInt8] {
        let now = Int64(SystemClock().wallMilliseconds() / 1000)
        return Array(try DeviceToken.mint(
            DeviceTokenClaims(userID: "alice", deviceID: "phone", expiresAt: now + seconds), key: Self.key).utf8)
    }

    /// The refusals the provider was asked about, in order.
    final class ProviderLog: Sendable {
        let asked = Mutex<[Close]>([])
        var codes: [CloseCode] { asked.withLock { $0.map(\.code) } }
    }

    private func stopped(_ events: [ClientEvent]) -> Bool {
        events.contains { if case .connectionStateChanged(.stopped) = $0 { return true } else { return false } }
    }

    @Test("an expired token: the provider is asked once, in the same attempt, and the client connects with the fresh token")
    func refreshInTheSameAttempt() throws {
        let server = try RealServer { $0.authKeys = [Self.key] }
        let log = ProviderLog()
        let fresh = try token(expiresIn: 3600)
        let client = try TestClient(port: server.port) {
            $0.credentials = try? self.token(expiresIn: -10)
            $0.credentialsProvider = { close in
                log.asked.withLock { $0.append(close) }
                return fresh
            }
        }
        defer { client.client.shutdown() }
        #expect(try client.connectAndSettle().resumed == false)
        #expect(log.codes == [.tokenExpired])
        #expect(client.core.queue.sync { client.core.credentials } == fresh, "a later reconnect must present the fresh token")
    }

    @Test("the provider has nothing at first: the client retries with back-off, never stops, and connects once it has a token")
    func providerWithoutTokenYet() throws {
        let server = try RealServer { $0.authKeys = [Self.key] }
        let log = ProviderLog()
        let fresh = try token(expiresIn: 3600)
        let client = try TestClient(port: server.port) {
            $0.credentials = try? self.token(expiresIn: -10)
            $0.credentialsProvider = { close in
                let calls = log.asked.withLock { asked -> Int in
                    asked.append(close)
                    return asked.count
                }
                return calls < 3 ? nil : fresh  // the app's backend is not reachable yet
            }
        }
        defer { client.client.shutdown() }
        do {
            try client.client.connect(timeout: .seconds(5))
            Issue.record("connected without fresh credentials")
        } catch {
            guard case .credentialsUnavailable(let close) = error else { Issue.record("got \(error)"); return }
            #expect(close.code == .tokenExpired && error.isRetryable)
        }
        #expect(client.recorder.wait { $0.contains { if case .connectionStateChanged(.connected) = $0 { return true } else { return false } } })
        #expect(!stopped(client.recorder.all))
        #expect(log.codes == [.tokenExpired, .tokenExpired, .tokenExpired])
    }

    @Test("without a provider an expired token does not stop the client: it waits and tries again")
    func noProviderKeepsTrying() throws {
        let server = try RealServer { $0.authKeys = [Self.key] }
        let client = try TestClient(port: server.port) { $0.credentials = try? self.token(expiresIn: -10) }
        defer { client.client.shutdown() }
        do {
            try client.client.connect(timeout: .seconds(5))
            Issue.record("an expired token was accepted")
        } catch {
            guard case .rejected(let close) = error else { Issue.record("got \(error)"); return }
            #expect(close.code == .tokenExpired && close.action == .refreshCredentials && error.isRetryable)
        }
        // Two more attempts after the first: it keeps trying, with back-off.
        #expect(client.recorder.wait { events in
            events.filter { if case .connectionStateChanged(.connecting) = $0 { return true } else { return false } }.count >= 3
        })
        #expect(!stopped(client.recorder.all))
    }

    @Test("a token for another device stops the client: a fresh one from the same backend would be refused too")
    func wrongDeviceStops() throws {
        let server = try RealServer { $0.authKeys = [Self.key] }
        let log = ProviderLog()
        let client = try TestClient(port: server.port, device: "tablet") {
            $0.credentials = try? self.token(expiresIn: 3600)  // minted for "phone"
            $0.credentialsProvider = { close in
                log.asked.withLock { $0.append(close) }
                return nil
            }
        }
        defer { client.client.shutdown() }
        #expect(throws: ConnectError.self) { try client.client.connect(timeout: .seconds(5)) }
        #expect(client.recorder.wait { self.stopped($0) })
        #expect(log.codes.isEmpty)
    }
}
