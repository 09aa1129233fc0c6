import Foundation
import SignalingSupport

/// A JSON value for `--json` output. Objects keep their fields in the order given, so
/// every line of one event type looks the same (a stable schema scripts can rely on).
public enum JSONValue: Sendable, Equatable {
    case string(String)
    case integer(Int64)
    case number(Double)
    case bool(Bool)
    case null
    case object([JSONField])

    public static func optional(_ value: String?) -> JSONValue { value.map { .string($0) } ?? .null }
    public static func milliseconds(_ duration: Duration?) -> JSONValue {
        duration.map { .number(Format.millisecondsValue($0)) } ?? .null
    }
    public static func unsigned(_ value: UInt64) -> JSONValue { .integer(Int64(clamping: value)) }

    /// The compact JSON text (RFC 8259), UTF-8 left as is, control characters escaped.
    public var serialized: String {
        var out = ""
        write(to: &out)
        return out
    }

    private func write(to out: inout String) {
        switch self {
        case .string(let text): Self.writeString(text, to: &out)
        case .integer(let value): out += String(value)
        case .number(let value): out += value.isFinite ? Self.number(value) : "null"
        case .bool(let value): out += value ? "true" : "false"
        case .null: out += "null"
        case .object(let fields):
            out += "{"
            for (index, field) in fields.enumerated() {
                if index > 0 { out += "," }
                Self.writeString(field.name, to: &out)
                out += ":"
                field.value.write(to: &out)
            }
            out += "}"
        }
    }

    /// Integral values without a fraction; others with up to three decimals.
    private static func number(_ value: Double) -> String {
        if value == value.rounded(), abs(value) < 1e15 { return String(Int64(value)) }
        var text = String(format: "%.3f", value)
        while text.hasSuffix("0") { text.removeLast() }
        return text
    }

    private static func writeString(_ text: String, to out: inout String) {
        TextEscaping.appendJSONString(text, to: &out)
    }
}

public struct JSONField: Sendable, Equatable {
    public var name: String
    public var value: JSONValue

    public init(_ name: String, _ value: JSONValue) {
        self.name = name
        self.value = value
    }
}
