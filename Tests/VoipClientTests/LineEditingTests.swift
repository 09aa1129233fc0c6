import Testing
@testable import VoipClientKit

@Suite("Key decoding")
struct KeyDecoderTests {
    @Test("printable text, control keys and UTF-8")
    func basics() {
        var decoder = KeyDecoder()
        #expect(decoder.feed(Array("hi é".utf8)) == [.character("h"), .character("i"), .character(" "), .character("é")])
        #expect(decoder.feed([0x01, 0x05, 0x7F, 0x08, 0x0D, 0x01, 0x0A, 0x03, 0x04, 0x17, 0x15, 0x0B, 0x19, 0x0C, 0x09, 0x10, 0x0E])
                == [.home, .end, .backspace, .backspace, .enter, .home, .enter, .interrupt, .endOfInput, .deleteWordBackward,
                    .killToStart, .killToEnd, .yank, .clearScreen, .tab, .up, .down])
    }

    @Test("CR LF is one Enter; a lone CR does not wait")
    func carriageReturn() {
        var decoder = KeyDecoder()
        #expect(decoder.feed([0x0D, 0x0A, 0x61]) == [.enter, .character("a")])
        #expect(decoder.feed([0x0D]) == [.enter])
    }

    @Test("escape sequences of the usual terminals, modifiers, and Alt keys")
    func escapeSequences() {
        var decoder = KeyDecoder()
        let sequences: [(String, Key)] = [
            ("\u{1B}[A", .up), ("\u{1B}[B", .down), ("\u{1B}[C", .right), ("\u{1B}[D", .left),
            ("\u{1B}[H", .home), ("\u{1B}[F", .end), ("\u{1B}OH", .home), ("\u{1B}OF", .end), ("\u{1B}OA", .up),
            ("\u{1B}[1~", .home), ("\u{1B}[7~", .home), ("\u{1B}[4~", .end), ("\u{1B}[8~", .end), ("\u{1B}[3~", .delete),
            ("\u{1B}[1;5C", .wordRight), ("\u{1B}[1;5D", .wordLeft), ("\u{1B}[1;3D", .wordLeft),
            ("\u{1B}b", .wordLeft), ("\u{1B}f", .wordRight), ("\u{1B}d", .deleteWordForward), ("\u{1B}\u{7F}", .deleteWordBackward),
        ]
        for (text, key) in sequences {
            #expect(decoder.feed(Array(text.utf8)) == [key], "\(text.debugDescription)")
        }
    }

    @Test("a sequence or a character split across reads is completed by the next read")
    func splitInput() {
        var decoder = KeyDecoder()
        #expect(decoder.feed([0x1B]) == [])
        #expect(decoder.feed([0x5B]) == [])
        #expect(decoder.feed([0x41, 0x61]) == [.up, .character("a")])
        let euro = Array("€".utf8)
        #expect(decoder.feed(euro[0..<1]) == [])
        #expect(decoder.feed(euro[1...]) == [.character("€")])
    }

    @Test("unknown sequences vanish whole; invalid UTF-8 becomes U+FFFD; other controls are dropped")
    func garbage() {
        var decoder = KeyDecoder()
        #expect(decoder.feed(Array("\u{1B}[5~\u{1B}[200~x\u{1B}[15;2Rz".utf8)) == [.character("x"), .character("z")])
        #expect(decoder.feed([0xFF, 0x61]) == [.character("\u{FFFD}"), .character("a")])
        #expect(decoder.feed([0xE2, 0x61]) == [.character("\u{FFFD}"), .character("a")])
        #expect(decoder.feed([0x00, 0x1A, 0x62]) == [.character("b")])
        // An endless CSI is dropped once it is longer than any real one.
        #expect(decoder.feed([0x1B, 0x5B] + Array(repeating: 0x31, count: 40)) == [])
        #expect(decoder.feed([0x63]) == [.character("c")])
    }
}

@Suite("Line editor")
struct LineEditorTests {
    private func type(_ text: String, into editor: inout LineEditor) {
        for character in text { _ = editor.apply(.character(character)) }
    }

    @Test("inserting, moving and deleting")
    func editing() {
        var editor = LineEditor()
        type("call bob", into: &editor)
        #expect(editor.text == "call bob" && editor.cursor == 8)
        #expect(editor.apply(.wordLeft) == .redraw)
        #expect(editor.cursor == 5)
        type("x", into: &editor)
        #expect(editor.text == "call xbob")
        #expect(editor.apply(.backspace) == .redraw)
        #expect(editor.apply(.home) == .redraw && editor.cursor == 0)
        #expect(editor.apply(.backspace) == .bell)
        #expect(editor.apply(.delete) == .redraw && editor.text == "all bob")
        #expect(editor.apply(.end) == .redraw && editor.cursor == 7)
        #expect(editor.apply(.delete) == .none)
        #expect(editor.apply(.transpose) == .redraw && editor.text == "all bbo")
        #expect(editor.apply(.wordRight) == .redraw && editor.cursor == 7)
    }

    @Test("kill and yank: Ctrl-W, Ctrl-U, Ctrl-K, Alt-D, Ctrl-Y")
    func killAndYank() {
        var editor = LineEditor()
        type("msg bob hello", into: &editor)
        _ = editor.apply(.deleteWordBackward)
        #expect(editor.text == "msg bob ")
        _ = editor.apply(.yank)
        #expect(editor.text == "msg bob hello")
        _ = editor.apply(.home)
        _ = editor.apply(.deleteWordForward)
        #expect(editor.text == " bob hello")
        _ = editor.apply(.killToEnd)
        #expect(editor.text == "" && editor.cursor == 0)
        type("abc", into: &editor)
        _ = editor.apply(.left)
        _ = editor.apply(.killToStart)
        #expect(editor.text == "c" && editor.cursor == 0)
    }

    @Test("Enter submits, clears and remembers; Up/Down browse the history and restore the draft")
    func history() {
        var editor = LineEditor(historyLimit: 3)
        for line in ["one", "two", "two", "  ", "three", "four"] {
            type(line, into: &editor)
            #expect(editor.apply(.enter) == .submit(line))
        }
        #expect(editor.history == ["two", "three", "four"], "no repeats, no blank lines, at most historyLimit")
        type("draft", into: &editor)
        #expect(editor.apply(.up) == .redraw && editor.text == "four")
        #expect(editor.apply(.up) == .redraw && editor.text == "three")
        #expect(editor.apply(.up) == .redraw && editor.text == "two")
        #expect(editor.apply(.up) == .bell && editor.text == "two")
        #expect(editor.apply(.down) == .redraw && editor.text == "three")
        #expect(editor.apply(.down) == .redraw && editor.text == "four")
        #expect(editor.apply(.down) == .redraw && editor.text == "draft")
        #expect(editor.apply(.down) == .bell)
    }

    @Test("Ctrl-D ends input only on an empty line; Ctrl-C discards the line")
    func endAndInterrupt() {
        var editor = LineEditor()
        #expect(editor.apply(.endOfInput) == .endOfInput)
        type("ab", into: &editor)
        _ = editor.apply(.home)
        #expect(editor.apply(.endOfInput) == .redraw && editor.text == "b")
        #expect(editor.apply(.interrupt) == .interrupt(hadText: true) && editor.text == "")
        #expect(editor.apply(.interrupt) == .interrupt(hadText: false))
    }

    @Test("Tab completes the first word: unique, common prefix, or the list")
    func completion() {
        var editor = LineEditor(completions: ["call", "calls", "cancel", "status"])
        type("st", into: &editor)
        #expect(editor.apply(.tab) == .redraw && editor.text == "status ")
        _ = editor.apply(.killToStart)
        type("ca", into: &editor)
        #expect(editor.apply(.tab) == .showCompletions(["call", "calls", "cancel"]))
        type("l", into: &editor)
        #expect(editor.apply(.tab) == .redraw && editor.text == "call")
        type(" b", into: &editor)
        #expect(editor.apply(.tab) == .bell, "only the first word completes")
    }
}

@Suite("Line renderer")
struct LineRendererTests {
    @Test("a short line: prompt, text, clear to the end, cursor placed after the prompt")
    func shortLine() {
        var renderer = LineRenderer()
        let out = renderer.render(prompt: "> ", buffer: Array("abc"), cursor: 1, width: 80)
        #expect(out == "\r> abc\u{1B}[K\r\u{1B}[3C")
    }

    @Test("a line wider than the terminal scrolls to keep the cursor visible and never reaches the last column")
    func scrolling() {
        var renderer = LineRenderer()
        let text = Array(String(repeating: "0123456789", count: 5))
        let atEnd = renderer.render(prompt: "p> ", buffer: text, cursor: text.count, width: 20)
        // 20 columns: prompt 3, 16 for text, the last one free.
        #expect(atEnd == "\rp> " + String(text[35...]) + "\u{1B}[K\r\u{1B}[18C")
        let atStart = renderer.render(prompt: "p> ", buffer: text, cursor: 0, width: 20)
        #expect(atStart == "\rp> " + String(text[0..<16]) + "\u{1B}[K\r\u{1B}[3C")
    }

    @Test("wide characters count two columns; a prompt too wide for the terminal is shortened")
    func widths() {
        #expect(DisplayWidth.of(Array("a漢e\u{301}")) == 4)
        var renderer = LineRenderer()
        let out = renderer.render(prompt: String(repeating: "x", count: 30), buffer: Array("漢字"), cursor: 2, width: 20)
        #expect(out == "\r> 漢字\u{1B}[K\r\u{1B}[6C")
    }
}

@Suite("Terminal text")
struct TerminalTextTests {
    @Test("control characters from elsewhere cannot reach the terminal")
    func sanitized() {
        #expect(TerminalText.sanitized("hi\u{1B}[2Jthere\u{07}\u{9B}x\nnext\tTab") == "hi^[[2Jthere^G\u{FFFD}x\nnext\tTab")
    }
}
