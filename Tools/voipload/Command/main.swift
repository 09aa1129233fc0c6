import VoipLoadKit
#if canImport(Glibc)
import Glibc
#endif

// voipload: see `voipload --help` and docs/LOAD-TESTING.md.
exit(LoadCommand.main(Array(CommandLine.arguments.dropFirst())))
