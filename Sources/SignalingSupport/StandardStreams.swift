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
        var bytes = Array(text.utf8)
        bytes.withUnsafeMutableBytes { buffer in
            var offset = 0
            while offset < buffer.count {
                #if canImport(Glibc)
                let written = Glibc.write(fd, buffer.baseAddress! + offset, buffer.count - offset)
                #else
                let written = Darwin.write(fd, buffer.baseAddress! + offset, buffer.count - offset)
                #endif
                if written < 0 && errno == EINTR { continue }
                if written <= 0 { return }
                offset += written
            }
        }
    }
}
