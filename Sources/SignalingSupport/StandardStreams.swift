#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Unbuffered writes to standard error and output, safe from any thread (each call is one
/// write(2), so concurrent lines do not interleave mid-line).
public enum StandardStreams {
    public static func error(_ text: String) { write(2, text) }
    public static func output(_ text: String) { write(1, text) }

    private static func write(_ fd: Int32, _ text: String) {
        Array(text.utf8).withUnsafeBytes { SystemCall.writeAll(fd, $0) }
    }
}
