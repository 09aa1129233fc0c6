import SignalingProtocol

/// A command typed at the interactive prompt. Call references (`REF`) are optional: a
/// call-id prefix or the peer's user id; without one, the only call the command fits.
enum InteractiveCommand: Sendable, Equatable {
    case call(String)
    case answer(String?)
    case reject(CallEndReason, String?)
    case cancel(String?)
    case hangUp(String?)
    case message(to: String, text: String)
    case calls
    case history
    case status
    case ping
    case background
    case foreground
    case connect
    case help
    case quit
    case nothing

    /// Command words for Tab completion.
    static let words = ["answer", "background", "calls", "call", "cancel", "connect", "foreground", "hangup", "help",
                        "history", "msg", "ping", "quit", "reject", "status"]

    static let helpText = """
        call USER              call USER (a probe socket is opened for the call)
        answer [REF]           answer a ringing call
        reject [busy] [REF]    decline (or say busy)
        cancel [REF]           give up a call you placed that is not answered yet
        hangup [REF]           end an active call
        msg USER TEXT...       send a message
        calls                  calls of this session, with timings and probe results
        history                messages of this session
        status                 connection, session, keep-alive, last PONG round trip, reconnects
        ping                   send one PING now and show the round trip
        background             simulate the app leaving the screen (suspended after 10 s)
        foreground             simulate the app coming back
        connect                connect again after the server stopped us
        help                   this list
        quit                   hang up or cancel your calls and leave (also Ctrl-D)
        REF is a call-id prefix or the peer's name; omit it when only one call fits.
        Keys: arrows, Home/End, Ctrl-A/E/B/F, Ctrl-W/U/K/Y, Alt-B/F, Up/Down history, Tab.
        """

    /// Parses one line; the error is the message to show.
    static func parse(_ line: String) -> Result<InteractiveCommand, CommandMistake> {
        let trimmed = line.drop(while: \.isWhitespace)
        guard let word = trimmed.split(separator: " ", maxSplits: 1).first.map(String.init)?.lowercased() else {
            return .success(.nothing)
        }
        let rest = trimmed.dropFirst(word.count).drop(while: \.isWhitespace)
        let arguments = rest.split(whereSeparator: \.isWhitespace).map(String.init)
        func optionalReference(_ name: String) -> Result<String?, CommandMistake> {
            arguments.count <= 1 ? .success(arguments.first) : .failure(CommandMistake("usage: \(name) [REF]"))
        }
        switch word {
        case "call", "dial":
            guard arguments.count == 1 else { return .failure(CommandMistake("usage: call USER")) }
            return .success(.call(arguments[0]))
        case "answer", "accept", "a":
            return optionalReference("answer").map { .answer($0) }
        case "reject", "decline":
            var remaining = arguments
            var reason = CallEndReason.declined
            if let first = remaining.first, first == "busy" || first == "declined" {
                reason = first == "busy" ? .busy : .declined
                remaining.removeFirst()
            }
            guard remaining.count <= 1 else { return .failure(CommandMistake("usage: reject [busy] [REF]")) }
            return .success(.reject(reason, remaining.first))
        case "cancel":
            return optionalReference("cancel").map { .cancel($0) }
        case "hangup", "hang", "bye", "h":
            return optionalReference("hangup").map { .hangUp($0) }
        case "msg", "message", "send", "m":
            let parts = rest.split(maxSplits: 1, whereSeparator: \.isWhitespace)
            guard parts.count == 2 else { return .failure(CommandMistake("usage: msg USER TEXT")) }
            return .success(.message(to: String(parts[0]), text: String(parts[1])))
        case "calls": return noArguments(arguments, .calls)
        case "history": return noArguments(arguments, .history)
        case "status": return noArguments(arguments, .status)
        case "ping": return noArguments(arguments, .ping)
        case "background", "bg": return noArguments(arguments, .background)
        case "foreground", "fg": return noArguments(arguments, .foreground)
        case "connect", "reconnect": return noArguments(arguments, .connect)
        case "help", "?": return .success(.help)
        case "quit", "exit", "q": return noArguments(arguments, .quit)
        default: return .failure(CommandMistake("unknown command '\(word)' (type 'help')"))
        }
    }

    private static func noArguments(_ arguments: [String], _ command: InteractiveCommand) -> Result<InteractiveCommand, CommandMistake> {
        arguments.isEmpty ? .success(command) : .failure(CommandMistake("'\(arguments[0])': this command takes no argument"))
    }
}

/// A line the prompt cannot run; the message says why.
struct CommandMistake: Error, Equatable, CustomStringConvertible {
    var message: String
    init(_ message: String) { self.message = message }
    var description: String { message }
}
