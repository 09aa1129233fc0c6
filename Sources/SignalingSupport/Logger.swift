import Synchronization
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Severity of a log line; lines below the logger's level are dropped before formatting.
public enum LogLevel: Int, Comparable, Sendable, CaseIterable {
    case debug = 0, info, warning, error

    public var name: String {
        switch self {
        case .debug: return "debug"
        case .info: return "info"
        case .warning: return "warn"
        case .error: return "error"
        }
    }

    public init?(name: String) {
        guard let level = LogLevel.allCases.first(where: { $0.name == name || (name == "warning" && $0 == .warning) })
        else { return nil }
        self = level
    }

    public static func < (a: LogLevel, b: LogLevel) -> Bool { a.rawValue < b.rawValue }
}

/// How a `Logger` writes its lines.
public enum LogFormat: String, Sendable, CaseIterable {
    /// `ts=... level=info event=listening addr=0.0.0.0:7443`, for people and grep.
    case keyValue = "kv"
    /// One JSON object per line, `{"ts":"...","level":"info","event":"listening",...}`, for
    /// log shippers (journald's JSON export, Loki, Elasticsearch). Integers and booleans
    /// are JSON numbers and booleans; everything else is a string.
    case json
}

/// Writes structured log lines, `key=value` pairs after a timestamp, level and event name:
///
///     ts=2026-11-29T13:40:00.123Z level=info event=listening addr=0.0.0.0:7443 workers=2
///
/// or the same as one JSON object per line (`LogFormat.json`).
///
/// Each line is a single write(2), so lines from several threads never interleave.
///
/// Copies of a logger share its level: setting it on one (a SIGHUP reload) changes what
/// every component that was handed a copy logs. Reading it is one relaxed atomic load.
public struct Logger: Sendable {
    /// The minimum level written, shared by every copy of this logger.
    public var level: LogLevel {
        get { LogLevel(rawValue: threshold.value.load(ordering: .relaxed)) ?? .info }
        nonmutating set { threshold.value.store(newValue.rawValue, ordering: .relaxed) }
    }
    private let threshold: Threshold
    private let fd: Int32
    private let clock: any Clock
    public let format: LogFormat

    private final class Threshold: Sendable {
        let value: Atomic<Int>
        init(_ level: LogLevel) { value = Atomic(level.rawValue) }
    }

    public init(level: LogLevel = .info, format: LogFormat = .keyValue, fileDescriptor: Int32 = 2, clock: any Clock = SystemClock()) {
        self.format = format
        self.threshold = Threshold(level)
        self.fd = fileDescriptor
        self.clock = clock
    }

    /// A logger that drops everything (for tests that do not read logs).
    public static let silent = Logger(level: .error, fileDescriptor: -1)

    public func enabled(_ level: LogLevel) -> Bool { level >= self.level }

    public func debug(_ event: String, _ fields: @autoclosure () -> KeyValuePairs<String, Any> = [:]) {
        guard enabled(.debug) else { return }
        write(.debug, event, fields())
    }

    public func info(_ event: String, _ fields: @autoclosure () -> KeyValuePairs<String, Any> = [:]) {
        guard enabled(.info) else { return }
        write(.info, event, fields())
    }

    public func warning(_ event: String, _ fields: @autoclosure () -> KeyValuePairs<String, Any> = [:]) {
        guard enabled(.warning) else { return }
        write(.warning, event, fields())
    }

    public func error(_ event: String, _ fields: @autoclosure () -> KeyValuePairs<String, Any> = [:]) {
        guard enabled(.error) else { return }
        write(.error, event, fields())
    }

    private func write(_ level: LogLevel, _ event: String, _ fields: KeyValuePairs<String, Any>) {
        guard fd >= 0 else { return }
        var line: String
        switch format {
        case .keyValue:
            line = "ts=\(Self.timestamp(clock.wallMilliseconds())) level=\(level.name) event=\(event)"
            for (key, value) in fields {
                line += " \(key)=\(Self.quoted(String(describing: value)))"
            }
        case .json:
            line = "{\"ts\":\"\(Self.timestamp(clock.wallMilliseconds()))\",\"level\":\"\(level.name)\",\"event\":\(Self.jsonString(event))"
            for (key, value) in fields {
                line += ",\(Self.jsonString(key)):\(Self.jsonValue(value))"
            }
            line += "}"
        }
        line += "\n"
        Array(line.utf8).withUnsafeBytes { SystemCall.writeAll(fd, $0) }
    }

    /// Values with spaces, quotes or `=` are quoted so lines stay machine-parsable.
    static func quoted(_ value: String) -> String {
        if value.isEmpty { return "\"\"" }
        guard value.contains(where: { $0 == " " || $0 == "\"" || $0 == "=" || $0 == "\n" }) else { return value }
        return "\"" + TextEscaping.backslashEscaped(value) + "\""
    }

    /// A JSON number for integers, `true`/`false` for booleans, else a JSON string.
    static func jsonValue(_ value: Any) -> String {
        switch value {
        case let value as Bool: return value ? "true" : "false"
        case let value as Int: return String(value)
        case let value as Int64: return String(value)
        case let value as Int32: return String(value)
        case let value as UInt64: return String(value)
        case let value as UInt32: return String(value)
        case let value as UInt16: return String(value)
        case let value as UInt8: return String(value)
        default: return jsonString(String(describing: value))
        }
    }

    static func jsonString(_ text: String) -> String { TextEscaping.jsonString(text) }

    /// RFC 3339 UTC with milliseconds.
    public static func timestamp(_ ms: UInt64) -> String {
        var seconds = time_t(ms / 1000)
        var parts = tm()
        gmtime_r(&seconds, &parts)
        func pad(_ v: Int32, _ width: Int) -> String {
            let s = String(v)
            return String(repeating: "0", count: max(0, width - s.count)) + s
        }
        return "\(pad(parts.tm_year + 1900, 4))-\(pad(parts.tm_mon + 1, 2))-\(pad(parts.tm_mday, 2))T"
            + "\(pad(parts.tm_hour, 2)):\(pad(parts.tm_min, 2)):\(pad(parts.tm_sec, 2)).\(pad(Int32(ms % 1000), 3))Z"
    }
}
