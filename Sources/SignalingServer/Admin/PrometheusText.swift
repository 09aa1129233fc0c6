import SignalingSupport

/// Builds a Prometheus text exposition (format 0.0.4): each family's `# HELP` and
/// `# TYPE` lines, then its samples. Names follow the conventions: counters end in
/// `_total`, durations are in seconds, sizes in bytes.
struct PrometheusText {
    private(set) var text = ""

    static let contentType = "text/plain; version=0.0.4; charset=utf-8"

    enum Kind: String {
        case counter, gauge, histogram
    }

    /// Starts a family. `name` is its samples' name (a counter's ends in `_total`; unlike
    /// OpenMetrics, the 0.0.4 text format names the family the same).
    mutating func family(_ name: String, _ kind: Kind, _ help: String) {
        text += "# HELP \(name) \(Self.escapedHelp(help))\n# TYPE \(name) \(kind.rawValue)\n"
    }

    mutating func sample(_ name: String, _ labels: KeyValuePairs<String, String> = [:], _ value: some BinaryInteger) {
        sample(name, Array(labels), String(value))
    }

    mutating func sample(_ name: String, _ labels: KeyValuePairs<String, String> = [:], _ value: Double) {
        sample(name, Array(labels), Self.format(value))
    }

    private mutating func sample(_ name: String, _ labels: [(key: String, value: String)], _ value: String) {
        text += name
        if !labels.isEmpty {
            text += "{" + labels.map { "\($0.key)=\"\(Self.escapedLabel($0.value))\"" }.joined(separator: ",") + "}"
        }
        text += " \(value)\n"
    }

    /// A whole histogram family in seconds from a nanosecond snapshot: cumulative
    /// `_bucket{le=...}` lines ending with `+Inf`, then `_sum` and `_count`.
    mutating func histogram(_ name: String, _ help: String, _ snapshot: HistogramSnapshot) {
        family(name, .histogram, help)
        histogramSamples(name, [], snapshot)
    }

    /// A histogram family with one histogram per value of the label `key` (each with its
    /// buckets, `_sum` and `_count`), in the order given.
    mutating func histogram(_ name: String, _ help: String, by key: String, _ snapshots: [(value: String, snapshot: HistogramSnapshot)]) {
        family(name, .histogram, help)
        for (value, snapshot) in snapshots { histogramSamples(name, [(key: key, value: value)], snapshot) }
    }

    private mutating func histogramSamples(_ name: String, _ labels: [(key: String, value: String)], _ snapshot: HistogramSnapshot) {
        var cumulative: UInt64 = 0
        for (index, count) in snapshot.counts.enumerated() {
            cumulative &+= count
            let bound = index < snapshot.bounds.count ? Self.format(Double(snapshot.bounds[index]) / 1e9) : "+Inf"
            sample(name + "_bucket", labels + [(key: "le", value: bound)], String(cumulative))
        }
        sample(name + "_sum", labels, Self.format(Double(snapshot.sumNanoseconds) / 1e9))
        sample(name + "_count", labels, String(snapshot.count))
    }

    static func format(_ value: Double) -> String {
        if value.isNaN { return "NaN" }
        if value.isInfinite { return value > 0 ? "+Inf" : "-Inf" }
        if value == value.rounded() && abs(value) < 1e15 { return String(Int64(value)) }
        return "\(value)"
    }

    static func escapedLabel(_ value: String) -> String { TextEscaping.backslashEscaped(value) }

    /// A HELP text escapes backslashes and line feeds, not quotes.
    static func escapedHelp(_ value: String) -> String { TextEscaping.backslashEscaped(value, quotes: false) }
}
