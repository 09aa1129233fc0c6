import Foundation
import SignalingSupport
#if canImport(Glibc)
import Glibc
#endif

/// Termination and window-size signals, turned into calls on a thread of our own instead
/// of asynchronous handlers (which could interrupt any thread mid-update, or leave the
/// terminal in raw mode).
public enum SignalWatcher {
    /// SIGINT, SIGTERM and SIGHUP end the program tidily; SIGWINCH redraws the prompt.
    static let watched: [Int32] = [SIGINT, SIGTERM, SIGHUP, SIGWINCH]

    /// Blocks the watched signals in the calling thread, so every thread created after
    /// this inherits the mask, and ignores SIGPIPE (a closed socket is an error return,
    /// not a death). Call first thing in `main`, before anything starts a thread.
    public static func blockSignals() {
        var set = signalSet()
        pthread_sigmask(SIG_BLOCK, &set, nil)
        signal(SIGPIPE, SIG_IGN)
    }

    /// Starts a thread that waits for the watched signals and calls `handler` with each.
    public static func start(_ handler: @escaping @Sendable (Int32) -> Void) {
        let thread = Thread {
            var set = signalSet()
            while true {
                var received: Int32 = 0
                if sigwait(&set, &received) == 0 { handler(received) }
            }
        }
        thread.name = "voipclient-signals"
        thread.start()
    }

    /// The conventional exit status of a program ended by `signal`.
    static func exitStatus(for signal: Int32) -> ExitStatus {
        signal == SIGINT ? .interrupted : .terminated
    }

    private static func signalSet() -> sigset_t {
        var set = sigset_t()
        sigemptyset(&set)
        for number in watched { sigaddset(&set, number) }
        return set
    }
}
