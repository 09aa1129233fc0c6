import Foundation

/// A fresh directory under the system's temporary directory, removed with its contents
/// when this object goes away.
public final class TemporaryDirectory: Sendable {
    public let path: String

    public init(_ prefix: String = "voip-test") throws {
        path = FileManager.default.temporaryDirectory
            .appendingPathComponent("\(prefix)-\(getpid())-\(UInt32.random(in: 0...UInt32.max))").path
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    }

    deinit { try? FileManager.default.removeItem(atPath: path) }

    public func file(_ name: String) -> String { path + "/" + name }
}
