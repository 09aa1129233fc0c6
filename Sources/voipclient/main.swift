// voipclient: parse the command line, run the chosen mode (interactive, listen, call or
// send), exit with its documented status. Everything else lives in VoipClientKit.
import VoipClientKit
#if canImport(Glibc)
import Glibc
#endif

// Before any thread exists, so that every thread inherits the mask and the termination
// signals reach only the watcher thread.
SignalWatcher.blockSignals()
exit(VoipClientMain.run(Array(CommandLine.arguments.dropFirst())))
