import SignalingSupport
#if canImport(Glibc)
import Glibc
#endif

/// What the user did at the prompt.
enum ConsoleInput: Sendable, Equatable {
    case line(String)
    /// Ctrl-D on an empty line, or the end of standard input.
    case endOfInput
    /// Ctrl-C (the line being typed was discarded).
    case interrupt(hadText: Bool)
}

/// Where the interactive session writes and reads. Used from one queue only (the
/// session's), so implementations need no locks.
protocol Console: AnyObject {
    /// Starts drawing (raw mode for a terminal). Throws when the terminal refuses.
    func start() throws(SystemError)
    /// Leaves the terminal as it was.
    func stop()
    /// Prints lines above the prompt; the prompt and what is being typed are redrawn
    /// under them, intact.
    func show(_ text: String)
    func setPrompt(_ prompt: String)
    func bell()
    func redraw()
    /// Feeds bytes read from standard input; returns what they completed.
    func feed(_ bytes: [UInt8]) -> [ConsoleInput]
}

/// Replaces control characters in text that came from elsewhere (message bodies, ids)
/// before it reaches a terminal, so a message cannot move the cursor, retitle the window
/// or hide text. Newlines and tabs stay.
enum TerminalText {
    static func sanitized(_ text: String) -> String {
        var out = String.UnicodeScalarView()
        for scalar in text.unicodeScalars {
            switch scalar.value {
            case 0x0A, 0x09: out.append(scalar)
            case 0x00..<0x20: out.append(contentsOf: "^\(Character(Unicode.Scalar(UInt8(scalar.value) + 0x40)))".unicodeScalars)
            case 0x7F, 0x80..<0xA0: out.append("\u{FFFD}")
            default: out.append(scalar)
            }
        }
        return String(out)
    }
}

/// A real terminal: raw mode, the line editor, and output that never garbles the line
/// being typed (clear the row, print, redraw prompt and line).
final class TerminalConsole: Console {
    private var editor: LineEditor
    private var renderer = LineRenderer()
    private var decoder = KeyDecoder()
    private var prompt = "> "
    private var active = false

    init(completions: [String]) {
        editor = LineEditor(completions: completions)
    }

    func start() throws(SystemError) {
        try TerminalDevice.enterRawMode(0)
        active = true
        redraw()
    }

    func stop() {
        guard active else { return }
        active = false
        StandardStreams.output("\r\u{1B}[K")
        TerminalDevice.restore(0)
    }

    func show(_ text: String) {
        guard active else {
            StandardStreams.output(TerminalText.sanitized(text) + "\n")
            return
        }
        StandardStreams.output("\r\u{1B}[K" + TerminalText.sanitized(text) + "\n" + currentLine())
    }

    func setPrompt(_ prompt: String) {
        guard prompt != self.prompt else { return }
        self.prompt = prompt
        redraw()
    }

    func bell() { if active { StandardStreams.output("\u{07}") } }

    func redraw() { if active { StandardStreams.output(currentLine()) } }

    func feed(_ bytes: [UInt8]) -> [ConsoleInput] {
        var inputs: [ConsoleInput] = []
        var needsRedraw = false
        for key in decoder.feed(bytes) {
            switch editor.apply(key) {
            case .none:
                break
            case .redraw:
                needsRedraw = true
            case .submit(let line):
                // The submitted line stays on screen, under the events printed before it.
                StandardStreams.output("\r\u{1B}[K" + prompt + TerminalText.sanitized(line) + "\n")
                renderer = LineRenderer()
                inputs.append(.line(line))
                needsRedraw = true
            case .endOfInput:
                inputs.append(.endOfInput)
            case .interrupt(let hadText):
                inputs.append(.interrupt(hadText: hadText))
                needsRedraw = true
            case .clearScreen:
                StandardStreams.output("\u{1B}[H\u{1B}[2J")
                needsRedraw = true
            case .bell:
                bell()
            case .showCompletions(let candidates):
                show(candidates.joined(separator: "  "))
            }
        }
        if needsRedraw { redraw() }
        return inputs
    }

    private func currentLine() -> String {
        renderer.render(prompt: prompt, buffer: editor.buffer, cursor: editor.cursor, width: TerminalDevice.columns(1))
    }
}

/// Standard input is not a terminal (a pipe, a file): no prompt, no editing; each line
/// read is a command and events are printed as plain lines, so scripts can drive the
/// interactive commands too.
final class PlainConsole: Console {
    private var partial: [UInt8] = []

    func start() throws(SystemError) {}
    func stop() {}
    func show(_ text: String) { StandardStreams.output(TerminalText.sanitized(text) + "\n") }
    func setPrompt(_ prompt: String) {}
    func bell() {}
    func redraw() {}

    func feed(_ bytes: [UInt8]) -> [ConsoleInput] {
        partial.append(contentsOf: bytes)
        var inputs: [ConsoleInput] = []
        while let newline = partial.firstIndex(of: 0x0A) {
            var line = Array(partial[..<newline])
            if line.last == 0x0D { line.removeLast() }
            partial.removeSubrange(...newline)
            inputs.append(.line(String(decoding: line, as: UTF8.self)))
        }
        return inputs
    }
}
