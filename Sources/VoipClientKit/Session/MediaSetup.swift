import Foundation
import SignalingClient

/// Makes the probe of a call and the offer/answer that announces it.
enum MediaSetup {
    /// Binds the probe socket to `--media-address` (or the local address of the signaling
    /// connection) and `--media-port`, before the offer or answer goes out, so the peer's
    /// first packet finds it. `report` runs on `queue`.
    static func makeProbe(_ options: MediaOptions, session: SessionInfo, queue: DispatchQueue,
                          report: @escaping @Sendable (CallProbe.Report) -> Void) -> Result<CallProbe, ProbeSetupError> {
        let host = options.address ?? session.localAddress.host
        guard let endpoint = UDPEndpoint(host: host, port: options.port) else {
            return .failure(ProbeSetupError(message: "'\(host)' is not a numeric address"))
        }
        let configuration = CallProbe.Configuration(packets: options.packets, interval: options.interval)
        do {
            let probe = try CallProbe(bindingTo: endpoint, configuration: configuration) { event in
                queue.async { report(event) }
            }
            probe.start()
            return .success(probe)
        } catch {
            return .failure(ProbeSetupError(message: "cannot open the probe socket: \(error)"))
        }
    }

    /// The offer or answer: the probe's address, or (no probe) just the origin, which a
    /// peer reads as "no probe".
    static func description(of probe: CallProbe?, _ common: CommonOptions) -> [UInt8] {
        let origin = "voipclient \(common.user) \(common.device)"
        guard let probe else { return Array("v=0\r\no=\(origin)\r\n".utf8) }
        return MediaDescription(endpoint: probe.local, origin: origin).bytes
    }

    /// How long to wait, after the answer, for the peer to say its burst is over before
    /// hanging up anyway (a peer that is not voipclient never says so).
    static func peerBurstAllowance(_ options: MediaOptions) -> Duration {
        CallProbe.Configuration(packets: options.packets, interval: options.interval).longestBurst + .seconds(2)
    }
}

struct ProbeSetupError: Error, CustomStringConvertible {
    var message: String
    var description: String { message }
}
