import Foundation
import SignalingProtocol
import SignalingServer
import SignalingSupport
@testable import SignalingClient

/// The real `SignalingServer`, in process, on an ephemeral loopback port.
final class RealServer {
    let server: SignalingServer
    var port: UInt16 { server.port }

    init(clock: any Clock = SystemClock(), _ configure: (inout ServerConfiguration) -> Void = { _ in }) throws {
        var configuration = ServerConfiguration()
        configuration.host = "127.0.0.1"
        configuration.port = 0
        configuration.workers = 1
        configuration.tickInterval = .milliseconds(5)
        configuration.drainTimeout = .seconds(1)
        configure(&configuration)
        server = try SignalingServer(configuration: configuration, clock: clock, logger: .silent)
        try server.start()
    }

    deinit { server.shutdown() }
}

extension TestClient {
    /// Connects (blocking) and waits until the connected state reached the app.
    @discardableResult
    func connectAndSettle(timeout: Duration = .seconds(5)) throws -> SessionInfo {
        let info = try client.connect(timeout: timeout)
        settle()
        return info
    }

    /// Calls a request API and waits for its completion.
    func request(_ body: (@escaping RequestCompletion) -> Void) throws -> Result<RequestAcceptance, RequestError> {
        let value = AsyncValue<Result<RequestAcceptance, RequestError>>()
        body { value.set(.success($0)) }
        return try value.value(within: 10)
    }
}
