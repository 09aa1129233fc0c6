import Foundation
import SignalingClient
import SignalingProtocol
import SignalingSupport
#if canImport(Glibc)
import Glibc
#endif

/// `voipclient ... push-register --kind KIND --token HEX`: exit 0 once the server
/// accepted the registration (PUSH_REGISTER's OK), so QA can point a device's push path at
/// a token of their choice.
///
/// Threading: `run` blocks the main thread; the completion and events run on `queue`.
public final class PushRegisterCommand: @unchecked Sendable {
    private let common: CommonOptions
    private let options: PushRegisterOptions
    private let reporter: Reporter
    private let queue = DispatchQueue(label: "voipclient.push-register")
    private let latch = OutcomeLatch()
    private let clock = SystemClock()

    public init(common: CommonOptions, options: PushRegisterOptions) {
        self.common = common
        self.options = options
        reporter = Reporter(json: common.json)
    }

    public func run() -> Outcome {
        let session: ClientSession
        do {
            session = try ClientSession(common: common, queue: queue) { [weak self] event in
                if case .connectionStateChanged(let state) = event, let stop = ClientSession.stopOutcome(state) { self?.latch.finish(stop) }
            }
        } catch {
            return finish(Outcome(.usage, error.message))
        }
        switch session.connect() {
        case .failure(let outcome):
            session.close()
            return finish(outcome)
        case .success(let info):
            reporter.emit(Reports.connected(info, common))
        }
        let sentAt = clock.now()
        session.client.registerPush(kind: options.kind, token: options.token, environment: options.environment,
                                    topic: options.topic) { [self] result in
            switch result {
            case .success(let acceptance):
                reporter.emit(Reports.pushRegistered(options, serverTime: acceptance.serverTime, elapsed: clock.now() - sentAt))
                latch.finish(.ok(options.token.isEmpty ? "push token of kind \(options.kind) unregistered" : "push token of kind \(options.kind) registered"))
            case .failure(let error):
                latch.finish(ClientSession.outcome(for: error, doing: "register the push token"))
            }
        }
        queue.asyncAfter(deadline: .now() + options.timeout.dispatchInterval) { [latch, options] in
            latch.finish(Outcome(.timedOut, "the server did not accept the registration within --timeout \(Format.seconds(options.timeout))"))
        }
        let outcome = latch.wait()
        session.close()
        return finish(outcome)
    }

    /// SIGINT/SIGTERM/SIGHUP: nothing to undo.
    public func interrupt(_ signal: Int32) {
        latch.finish(Outcome(SignalWatcher.exitStatus(for: signal), "interrupted before the server accepted the registration"))
    }

    private func finish(_ outcome: Outcome) -> Outcome {
        reporter.finish(outcome, [JSONField("kind", .string(options.kind.platform))])
        return outcome
    }
}
