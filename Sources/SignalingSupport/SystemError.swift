#if canImport(Glibc)
import Glibc
#endif

/// A failed system call: which one and errno, printable.
public struct SystemError: Error, Sendable, CustomStringConvertible {
    public var call: String
    public var code: Int32

    public init(_ call: String, _ code: Int32) {
        self.call = call
        self.code = code
    }

    /// The C library's text for the errno, e.g. "Connection refused".
    public var reason: String { String(cString: strerror(code)) }
    public var description: String { "\(call): \(reason)" }
}
