import Foundation
import SignalingSupport

/// Number formatting shared by the text and JSON output.
enum Format {
    /// Milliseconds as a number: three decimals (microseconds), as in `--json`.
    static func millisecondsValue(_ duration: Duration) -> Double {
        (duration.seconds * 1_000_000).rounded() / 1000
    }

    /// "12.35 ms" in text output.
    static func milliseconds(_ duration: Duration) -> String {
        String(format: "%.2f ms", duration.seconds * 1000)
    }

    /// "1.02 s" in text output.
    static func seconds(_ duration: Duration) -> String {
        String(format: "%.2f s", duration.seconds)
    }

    static func percent(_ value: Double) -> String { String(format: "%.1f", value) }

    /// Local wall-clock time of day, "14:03:27", for the interactive console.
    static func timeOfDay(_ milliseconds: UInt64) -> String {
        var seconds = time_t(milliseconds / 1000)
        var parts = tm()
        localtime_r(&seconds, &parts)
        return String(format: "%02d:%02d:%02d", parts.tm_hour, parts.tm_min, parts.tm_sec)
    }

    /// "1 call", "2 calls".
    static func count(_ value: Int, _ noun: String) -> String { "\(value) \(noun)\(value == 1 ? "" : "s")" }

    /// The first 8 characters of an id, for text output (JSON always has the whole id).
    static func short(_ id: String) -> String { id.count > 8 ? String(id.prefix(8)) : id }

    /// A message body for people: the text, or a note when it is not UTF-8.
    static func body(_ bytes: [UInt8], contentType: String) -> String {
        if let text = String(validating: bytes, as: UTF8.self) { return text }
        return "<\(bytes.count) bytes of \(contentType)>"
    }
}
