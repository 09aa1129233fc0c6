import Testing
@testable import VoipClientKit

@Suite("Interactive commands")
struct InteractiveCommandTests {
    @Test("commands, aliases and call references")
    func parsing() throws {
        let cases: [(String, InteractiveCommand)] = [
            ("call bob", .call("bob")), ("  answer", .answer(nil)), ("answer 3f2a", .answer("3f2a")),
            ("reject", .reject(.declined, nil)), ("reject busy", .reject(.busy, nil)), ("decline busy bob", .reject(.busy, "bob")),
            ("cancel", .cancel(nil)), ("hangup", .hangUp(nil)), ("bye 3f", .hangUp("3f")),
            ("msg bob hello   world ", .message(to: "bob", text: "hello   world ")), ("calls", .calls), ("history", .history),
            ("status", .status), ("ping", .ping), ("bg", .background), ("foreground", .foreground), ("connect", .connect),
            ("help", .help), ("QUIT", .quit), ("exit", .quit), ("", .nothing), ("   ", .nothing),
        ]
        for (line, expected) in cases {
            #expect(try InteractiveCommand.parse(line).get() == expected, "\(line)")
        }
    }

    @Test("mistakes say what is expected", arguments: [
        ("dance", "unknown command"), ("call", "usage: call USER"), ("call a b", "usage: call USER"),
        ("msg bob", "usage: msg USER TEXT"), ("reject busy a b", "usage: reject"), ("status now", "takes no argument"),
        ("hangup a b", "usage: hangup"),
    ])
    func mistakes(line: String, expected: String) {
        guard case .failure(let mistake) = InteractiveCommand.parse(line) else { Issue.record("accepted \(line)"); return }
        #expect(mistake.message.contains(expected), "\(mistake.message)")
    }

    @Test("a call reference picks the only eligible call, a call-id prefix or the peer")
    func references() {
        var book = CallBook()
        book.add(CallRecord(id: "aaaa1111", direction: .incoming, peer: "bob", state: .ringing, startedAtWall: 0))
        book.add(CallRecord(id: "bbbb2222", direction: .incoming, peer: "carol", state: .ringing, startedAtWall: 0))
        book.add(CallRecord(id: "cccc3333", direction: .outgoing, peer: "dave", state: .active, startedAtWall: 0))
        let ringing: (CallRecord) -> Bool = { $0.state == .ringing }
        #expect(book.resolve(nil, what: "ringing", eligible: { $0.state == .active }).map(\.id) == .success("cccc3333"))
        #expect(book.resolve("bbbb", what: "ringing", eligible: ringing).map(\.id) == .success("bbbb2222"))
        #expect(book.resolve("bob", what: "ringing", eligible: ringing).map(\.id) == .success("aaaa1111"))
        #expect(book.resolve(nil, what: "ringing", eligible: ringing).errorMessage.hasPrefix("several ringing calls"))
        #expect(book.resolve("zz", what: "ringing", eligible: ringing).errorMessage == "no ringing call matches 'zz'")
        #expect(book.ringingIncoming.map(\.peer) == ["bob", "carol"])
    }
}
