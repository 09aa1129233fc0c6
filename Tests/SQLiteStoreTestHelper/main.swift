// sqlite-store-test-helper: runs a SQLiteEventStore in a child process, for the tests
// that need a real process boundary.
//
//   commit-batches DIR SYNCHRONOUS FIRST
//       Opens the store in DIR (synchronous: normal or full) and applies
//       CrashWorkload.batch(FIRST), batch(FIRST + 1), ... for ever, writing
//       "committed N" to stdout after each apply returns. The test kills it with SIGKILL.
//   open-and-apply DIR
//       As an unprivileged user when started as root (root ignores file permissions):
//       opens the store and applies one batch, writing "opened" / "applied" or
//       "error KIND MESSAGE" for the step that failed.
//
// Exit status 0 when it ran as asked (a store error is a result, not a failure),
// 2 for bad arguments or a failed privilege drop.
import SQLiteStoreFixtures
import SignalingStore
import SignalingStoreSQLite
import SignalingSupport
#if canImport(Glibc)
import Glibc
#endif

func fail(_ message: String) -> Never {
    StandardStreams.error("sqlite-store-test-helper: \(message)\n")
    exit(2)
}

func report(_ error: StoreError) {
    StandardStreams.output("error \(error.kind) \(error.message)\n")
}

func commitBatches(directory: String, synchronous: SQLiteStoreConfiguration.Synchronous, first: Int) -> Never {
    let store: SQLiteEventStore
    do {
        store = try SQLiteEventStore(configuration: SQLiteStoreConfiguration(directory: directory, synchronous: synchronous))
    } catch {
        report(error)
        exit(0)
    }
    var number = first
    while true {
        do {
            try store.apply(CrashWorkload.batch(number))
        } catch {
            report(error)
            exit(0)
        }
        StandardStreams.output("committed \(number)\n")
        number += 1
    }
}

/// Root bypasses permission bits, so a read-only directory is only read-only to someone
/// else: become "nobody" (65534) for good before touching the store.
func dropPrivilegesIfRoot() {
    guard geteuid() == 0 else { return }
    let nobody: UInt32 = 65534
    guard setgroups(0, nil) == 0, setgid(nobody) == 0, setuid(nobody) == 0 else {
        fail("cannot drop root privileges: \(String(cString: strerror(errno)))")
    }
}

func openAndApply(directory: String) {
    dropPrivilegesIfRoot()
    let store: SQLiteEventStore
    do {
        store = try SQLiteEventStore(configuration: SQLiteStoreConfiguration(directory: directory))
    } catch {
        report(error)
        return
    }
    StandardStreams.output("opened\n")
    do {
        try store.apply(CrashWorkload.batch(0))
        StandardStreams.output("applied\n")
    } catch {
        report(error)
    }
    store.close()
}

let arguments = Array(CommandLine.arguments.dropFirst())
switch arguments.first {
case "commit-batches":
    guard arguments.count == 4,
          let synchronous = SQLiteStoreConfiguration.Synchronous(rawValue: arguments[2]),
          let first = Int(arguments[3]), first >= 0
    else { fail("usage: commit-batches DIR normal|full FIRST") }
    commitBatches(directory: arguments[1], synchronous: synchronous, first: first)
case "open-and-apply":
    guard arguments.count == 2 else { fail("usage: open-and-apply DIR") }
    openAndApply(directory: arguments[1])
default:
    fail("unknown command; use commit-batches or open-and-apply")
}
