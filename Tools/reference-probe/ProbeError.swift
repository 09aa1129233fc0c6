#if canImport(Glibc)
import Glibc
#endif

/// Why the probe could not run or had to stop: printed, exit status 2.
struct ProbeError: Error, Sendable, CustomStringConvertible {
    var message: String

    init(_ message: String) { self.message = message }

    /// A failed system call, with the C library's text for the current errno.
    init(call: String, code: Int32 = errno) {
        message = "\(call): \(String(cString: strerror(code)))"
    }

    var description: String { message }
}
