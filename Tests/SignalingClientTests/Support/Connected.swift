import Foundation
import SignalingProtocol
import SignalingSupport
@testable import SignalingClient

/// A client connected to a scripted server, with the server side at hand.
struct ConnectedPair {
    let server: ScriptedServer
    let test: TestClient
    var peer: PeerConnection
    let hello: Hello
    let info: SessionInfo

    init(clock: any Clock = SystemClock(), keepAlive: UInt32 = 600, sessionID: SessionID = SessionID(high: 10, low: 20),
         monitor: (any NetworkMonitor)? = nil, configure: (inout ClientConfiguration) -> Void = { _ in }) throws {
        server = try ScriptedServer()
        test = try TestClient(port: server.port, clock: clock, networkMonitor: monitor, configure: configure)
        let server = self.server
        let serverSide = Thread.runAsync { try server.acceptSession(sessionID: sessionID, keepAlive: keepAlive) }
        info = try test.client.connect(timeout: .seconds(5))
        (peer, hello) = try serverSide.value()
        test.settle()
    }

    var client: SignalingClient { test.client }
    var recorder: EventRecorder { test.recorder }
    var core: ClientCore { test.core }

    func shutdown() {
        test.client.shutdown()
        peer.close()
    }
}
