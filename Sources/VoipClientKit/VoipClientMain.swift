import SignalingSupport
#if canImport(Glibc)
import Glibc
#endif

/// What `voipclient`'s `main` runs: parse the command line, build the mode, run it.
public enum VoipClientMain {
    /// Returns the exit status. Call `SignalWatcher.blockSignals()` before this.
    public static func run(_ arguments: [String]) -> Int32 {
        let invocation: Invocation
        do {
            invocation = try VoipClientOptions.parse(arguments)
        } catch {
            StandardStreams.error("voipclient: \(error.message)\nUSAGE: \(VoipClientOptions.parser.usage)\nTry 'voipclient --help'.\n")
            return ExitStatus.usage.rawValue
        }
        let command: VoipClientCommand
        switch invocation {
        case .help:
            StandardStreams.output(VoipClientOptions.parser.helpText)
            return ExitStatus.ok.rawValue
        case .version:
            StandardStreams.output(ProductVersion.line(for: "voipclient"))
            return ExitStatus.ok.rawValue
        case .run(let parsed):
            command = parsed
        }
        switch command {
        case .call(let common, let options):
            let call = CallCommand(common: common, options: options)
            SignalWatcher.start { signal in if signal != SIGWINCH { call.interrupt(signal) } }
            return call.run().status.rawValue
        case .listen(let common, let options):
            let listen = ListenCommand(common: common, options: options)
            SignalWatcher.start { signal in if signal != SIGWINCH { listen.interrupt(signal) } }
            return listen.run().status.rawValue
        case .send(let common, let options):
            let send = SendCommand(common: common, options: options)
            SignalWatcher.start { signal in if signal != SIGWINCH { send.interrupt(signal) } }
            return send.run().status.rawValue
        case .pushRegister(let common, let options):
            let register = PushRegisterCommand(common: common, options: options)
            SignalWatcher.start { signal in if signal != SIGWINCH { register.interrupt(signal) } }
            return register.run().status.rawValue
        case .interactive(let common):
            let console = InteractiveSession(common: common)
            SignalWatcher.start { signal in console.signalReceived(signal) }
            return console.run().status.rawValue
        }
    }
}
