/// Draws the prompt and the line being typed on one terminal row. A line wider than the
/// terminal scrolls sideways around the cursor instead of wrapping, so redrawing is
/// always "carriage return, write, clear to end of line, place the cursor": it cannot
/// leave fragments of a wrapped line behind when events are printed above it.
public struct LineRenderer: Sendable {
    /// The first character shown (kept between draws so the view does not jump).
    private(set) var scrollOffset = 0
    /// A prompt wider than this share of the terminal is shortened to "> ".
    static let minimumInputColumns = 10

    public init() {}

    /// The bytes that draw `prompt` and `buffer` with the cursor at `cursor`, on a
    /// terminal `width` columns wide (the last column stays free: writing it would wrap on
    /// some terminals).
    public mutating func render(prompt: String, buffer: [Character], cursor: Int, width: Int) -> String {
        var shownPrompt = prompt
        var promptWidth = DisplayWidth.of(prompt)
        if promptWidth > width - Self.minimumInputColumns {
            shownPrompt = "> "
            promptWidth = 2
        }
        let available = max(1, width - promptWidth - 1)
        let widths = buffer.map(DisplayWidth.of)
        func span(_ range: Range<Int>) -> Int { widths[range].reduce(0, +) }

        scrollOffset = min(scrollOffset, cursor)
        // The cursor's own cell must fit too.
        while scrollOffset < cursor && span(scrollOffset..<cursor) + 1 > available { scrollOffset += 1 }
        // Use free room on the right to show more of the start (after deletions).
        while scrollOffset > 0 && span((scrollOffset - 1)..<buffer.count) + 1 <= available { scrollOffset -= 1 }

        var end = scrollOffset
        var used = 0
        while end < buffer.count && used + widths[end] <= available {
            used += widths[end]
            end += 1
        }
        let column = promptWidth + span(scrollOffset..<cursor)
        var out = "\r" + shownPrompt + String(buffer[scrollOffset..<end]) + "\u{1B}[K\r"
        if column > 0 { out += "\u{1B}[\(column)C" }
        return out
    }
}
