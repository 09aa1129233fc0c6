/// The line being typed, its cursor, the history and the kill buffer: Emacs-style
/// editing as in bash and libedit, as a value with no I/O (the console draws it).
public struct LineEditor: Sendable {
    public enum Action: Sendable, Equatable {
        /// Nothing visible changed.
        case none
        /// The line or the cursor changed: draw it again.
        case redraw
        /// Enter: the line (already cleared from the editor and added to the history).
        case submit(String)
        /// Ctrl-D on an empty line.
        case endOfInput
        /// Ctrl-C: the line was discarded; `hadText` says whether there was one.
        case interrupt(hadText: Bool)
        /// Ctrl-L.
        case clearScreen
        /// Nothing to do (end of history, no completion): ring the bell.
        case bell
        /// Tab with several candidates: show them.
        case showCompletions([String])
    }

    public private(set) var buffer: [Character] = []
    public private(set) var cursor = 0
    public private(set) var history: [String] = []
    public let historyLimit: Int
    /// Words Tab completes at the start of the line (the console's commands).
    public var completions: [String]

    /// While browsing the history: which entry is shown, and the line typed before.
    private var historyIndex: Int?
    private var draft: [Character] = []
    private var killBuffer: [Character] = []

    public init(historyLimit: Int = 500, completions: [String] = []) {
        self.historyLimit = historyLimit
        self.completions = completions
    }

    public var text: String { String(buffer) }

    public mutating func apply(_ key: Key) -> Action {
        switch key {
        case .character(let character):
            guard !character.unicodeScalars.contains(where: { $0.properties.generalCategory == .control }) else { return .none }
            buffer.insert(character, at: cursor)
            cursor += 1
        case .enter:
            let line = text
            addToHistory(line)
            buffer = []
            cursor = 0
            historyIndex = nil
            return .submit(line)
        case .backspace:
            guard cursor > 0 else { return .bell }
            cursor -= 1
            buffer.remove(at: cursor)
        case .delete:
            guard cursor < buffer.count else { return .none }
            buffer.remove(at: cursor)
        case .endOfInput:
            if buffer.isEmpty { return .endOfInput }
            guard cursor < buffer.count else { return .none }
            buffer.remove(at: cursor)
        case .left:
            guard cursor > 0 else { return .none }
            cursor -= 1
        case .right:
            guard cursor < buffer.count else { return .none }
            cursor += 1
        case .home: cursor = 0
        case .end: cursor = buffer.count
        case .wordLeft: cursor = wordStart(before: cursor)
        case .wordRight: cursor = wordEnd(after: cursor)
        case .deleteWordBackward:
            let start = wordStart(before: cursor)
            guard start < cursor else { return .none }
            killBuffer = Array(buffer[start..<cursor])
            buffer.removeSubrange(start..<cursor)
            cursor = start
        case .deleteWordForward:
            let end = wordEnd(after: cursor)
            guard end > cursor else { return .none }
            killBuffer = Array(buffer[cursor..<end])
            buffer.removeSubrange(cursor..<end)
        case .killToEnd:
            guard cursor < buffer.count else { return .none }
            killBuffer = Array(buffer[cursor...])
            buffer.removeSubrange(cursor...)
        case .killToStart:
            guard cursor > 0 else { return .none }
            killBuffer = Array(buffer[..<cursor])
            buffer.removeSubrange(..<cursor)
            cursor = 0
        case .yank:
            guard !killBuffer.isEmpty else { return .none }
            buffer.insert(contentsOf: killBuffer, at: cursor)
            cursor += killBuffer.count
        case .transpose:
            // Swap the two characters before the cursor (at the end) or around it.
            guard buffer.count >= 2, cursor > 0 else { return .bell }
            let right = min(cursor, buffer.count - 1)
            buffer.swapAt(right - 1, right)
            cursor = right + 1
        case .up: return browseHistory(older: true)
        case .down: return browseHistory(older: false)
        case .clearScreen: return .clearScreen
        case .interrupt:
            let hadText = !buffer.isEmpty
            buffer = []
            cursor = 0
            historyIndex = nil
            return .interrupt(hadText: hadText)
        case .tab: return complete()
        }
        return .redraw
    }

    /// Adds a line to the history (not empty lines, not a repeat of the last one).
    public mutating func addToHistory(_ line: String) {
        guard !line.allSatisfy(\.isWhitespace), history.last != line else { return }
        history.append(line)
        if history.count > historyLimit { history.removeFirst(history.count - historyLimit) }
    }

    private mutating func browseHistory(older: Bool) -> Action {
        if older {
            guard !history.isEmpty, historyIndex != 0 else { return .bell }
            if historyIndex == nil { draft = buffer }
            historyIndex = (historyIndex ?? history.count) - 1
        } else {
            guard let index = historyIndex else { return .bell }
            historyIndex = index + 1 < history.count ? index + 1 : nil
        }
        buffer = historyIndex.map { Array(history[$0]) } ?? draft
        cursor = buffer.count
        return .redraw
    }

    /// Completes the first word from `completions`.
    private mutating func complete() -> Action {
        let beforeCursor = buffer[..<cursor]
        guard !beforeCursor.contains(where: \.isWhitespace) else { return .bell }
        let prefix = String(beforeCursor)
        let candidates = completions.filter { $0.hasPrefix(prefix) }
        guard !candidates.isEmpty else { return .bell }
        if candidates.count == 1 {
            replacePrefix(with: candidates[0] + " ")
            return .redraw
        }
        let common = candidates.dropFirst().reduce(candidates[0]) { String($0.sharedPrefix(with: $1)) }
        if common.count > prefix.count {
            replacePrefix(with: common)
            return .redraw
        }
        return .showCompletions(candidates)
    }

    private mutating func replacePrefix(with text: String) {
        buffer.replaceSubrange(..<cursor, with: Array(text))
        cursor = text.count
    }

    private func wordStart(before position: Int) -> Int {
        var index = position
        while index > 0 && buffer[index - 1].isWhitespace { index -= 1 }
        while index > 0 && !buffer[index - 1].isWhitespace { index -= 1 }
        return index
    }

    private func wordEnd(after position: Int) -> Int {
        var index = position
        while index < buffer.count && buffer[index].isWhitespace { index += 1 }
        while index < buffer.count && !buffer[index].isWhitespace { index += 1 }
        return index
    }
}

extension String {
    fileprivate func sharedPrefix(with other: String) -> Substring {
        var end = startIndex
        var otherIndex = other.startIndex
        while end < endIndex, otherIndex < other.endIndex, self[end] == other[otherIndex] {
            end = index(after: end)
            otherIndex = other.index(after: otherIndex)
        }
        return self[..<end]
    }
}
