import Foundation
import SignalingClient
import SignalingProtocol

/// Every event voipclient reports, with its JSON fields and its text line. This file is
/// the schema of `--json` (docs/VOIPCLIENT.md, "JSON output"): fields are only ever added
/// at the end, never renamed or removed.
public enum Reports {
    /// `server` is the one that answered (of `--server`'s list).
    static func connected(_ info: SessionInfo, _ common: CommonOptions) -> ReportEvent {
        let server = info.server ?? common.servers[0]
        return ReportEvent("connected", [
            JSONField("server", .string(server.description)), JSONField("user", .string(common.user)),
            JSONField("device", .string(common.device)), JSONField("session", .string(info.sessionID.description)),
            JSONField("resumed", .bool(info.resumed)), JSONField("keepalive_s", .integer(Int64(info.keepAliveInterval.seconds))),
            JSONField("local", .string(info.localAddress.description)), JSONField("remote", .string(info.remoteAddress.description)),
        ], text: "connected to \(server) as \(common.user)@\(common.device) (keep-alive \(Int(info.keepAliveInterval.seconds)) s)")
    }

    static func connection(_ state: ConnectionState) -> ReportEvent {
        let (word, detail) = ConnectionStateText.describe(state)
        return ReportEvent("connection", [JSONField("state", .string(word)), JSONField("detail", .string(detail))],
                           text: "connection: \(word)\(detail.isEmpty ? "" : " (\(detail))")")
    }

    static func listening(_ common: CommonOptions, answering: ListenOptions.Answering) -> ReportEvent {
        let mode: String
        switch answering {
        case .report: mode = "report"
        case .autoAnswer: mode = "auto-answer"
        case .autoReject: mode = "auto-reject"
        }
        return ReportEvent("listening", [JSONField("user", .string(common.user)), JSONField("device", .string(common.device)),
                                         JSONField("mode", .string(mode))],
                           text: "listening as \(common.user)@\(common.device) (\(mode))")
    }

    static func callInvited(callID: String, callee: String, media: UDPEndpoint?) -> ReportEvent {
        ReportEvent("call_invited", [JSONField("call_id", .string(callID)), JSONField("callee", .string(callee)),
                                     JSONField("media", .optional(media?.description))],
                    text: "calling \(callee) (call \(Format.short(callID)))" + (media.map { ", probe socket \($0)" } ?? ""))
    }

    static func callRinging(callID: String, device: String, inviteToRinging: Duration?) -> ReportEvent {
        ReportEvent("call_ringing", [JSONField("call_id", .string(callID)), JSONField("device", .string(device)),
                                     JSONField("invite_to_ringing_ms", .milliseconds(inviteToRinging))],
                    text: "ringing on device \(device)" + (inviteToRinging.map { " after \(Format.milliseconds($0))" } ?? ""))
    }

    static func callAnswered(callID: String, device: String, inviteToAnswer: Duration?, peerMedia: Result<MediaDescription, MediaDescription.ParseError>) -> ReportEvent {
        ReportEvent("call_answered", [
            JSONField("call_id", .string(callID)), JSONField("device", .string(device)),
            JSONField("invite_to_answer_ms", .milliseconds(inviteToAnswer)),
            JSONField("peer_media", .optional(try? peerMedia.get().endpoint.description)),
        ], text: "answered on device \(device)" + (inviteToAnswer.map { " after \(Format.milliseconds($0))" } ?? "")
            + Self.mediaNote(peerMedia))
    }

    static func callIncoming(_ call: IncomingCall, peerMedia: Result<MediaDescription, MediaDescription.ParseError>) -> ReportEvent {
        ReportEvent("call_incoming", [
            JSONField("call_id", .string(call.callID)), JSONField("caller", .string(call.caller)),
            JSONField("caller_device", .string(call.callerDevice)), JSONField("server_time", .unsigned(call.serverTime)),
            JSONField("peer_media", .optional(try? peerMedia.get().endpoint.description)),
        ], text: "incoming call from \(call.caller) (device \(call.callerDevice), call \(Format.short(call.callID)))")
    }

    static func callAccepted(callID: String, media: UDPEndpoint?) -> ReportEvent {
        ReportEvent("call_accepted", [JSONField("call_id", .string(callID)), JSONField("media", .optional(media?.description))],
                    text: "answered call \(Format.short(callID))" + (media.map { ", probe socket \($0)" } ?? ""))
    }

    static func callRejected(callID: String, reason: CallEndReason) -> ReportEvent {
        ReportEvent("call_rejected", [JSONField("call_id", .string(callID)), JSONField("reason", .string("\(reason)"))],
                    text: "rejected call \(Format.short(callID)) (\(reason))")
    }

    static func callHungUp(callID: String, answerToHangup: Duration?) -> ReportEvent {
        ReportEvent("call_hangup", [JSONField("call_id", .string(callID)), JSONField("answer_to_hangup_ms", .milliseconds(answerToHangup))],
                    text: "hung up" + (answerToHangup.map { " after \(Format.seconds($0)) of call" } ?? ""))
    }

    static func callCancelled(callID: String, why: String) -> ReportEvent {
        ReportEvent("call_cancelled", [JSONField("call_id", .string(callID)), JSONField("why", .string(why))],
                    text: "cancelled call \(Format.short(callID)): \(why)")
    }

    static func callEnded(callID: String, reason: CallEndReason, peer: String, serverTime: UInt64) -> ReportEvent {
        ReportEvent("call_ended", [JSONField("call_id", .string(callID)), JSONField("reason", .string("\(reason)")),
                                   JSONField("peer", .string(peer)), JSONField("server_time", .unsigned(serverTime))],
                    text: "call \(Format.short(callID)) ended: \(CallEndText.describe(reason, peer: peer))")
    }

    static func probe(callID: String, _ statistics: ProbeStatistics, peer: UDPEndpoint) -> ReportEvent {
        ReportEvent("probe", [
            JSONField("call_id", .string(callID)), JSONField("peer", .string(peer.description)),
            JSONField("sent", .integer(Int64(statistics.sent))), JSONField("received", .integer(Int64(statistics.received))),
            JSONField("loss_pct", .number(statistics.lossPercent)),
            JSONField("rtt_min_ms", .milliseconds(statistics.minimumRoundTrip)),
            JSONField("rtt_avg_ms", .milliseconds(statistics.averageRoundTrip)),
            JSONField("rtt_max_ms", .milliseconds(statistics.maximumRoundTrip)),
            JSONField("jitter_ms", .milliseconds(statistics.jitter)),
        ], text: ProbeText.describe(statistics, peer: peer))
    }

    static func probeSkipped(callID: String, why: String) -> ReportEvent {
        ReportEvent("probe_skipped", [JSONField("call_id", .string(callID)), JSONField("why", .string(why))],
                    text: "media probe skipped: \(why)")
    }

    static func message(_ message: DeliveredMessage) -> ReportEvent {
        let bodyField: JSONField
        if let text = String(validating: message.body, as: UTF8.self) {
            bodyField = JSONField("body", .string(text))
        } else {
            bodyField = JSONField("body_base64", .string(Data(message.body).base64EncodedString()))
        }
        return ReportEvent("message", [
            JSONField("message_id", .string(message.messageID)), JSONField("sender", .string(message.sender)),
            JSONField("sender_device", .string(message.senderDevice)), JSONField("content_type", .string(message.contentType)),
            JSONField("server_time", .unsigned(message.serverTime)), bodyField,
        ], text: "message from \(message.sender): \(Format.body(message.body, contentType: message.contentType))")
    }

    static func messageAccepted(messageID: String, recipient: String, serverTime: UInt64, elapsed: Duration) -> ReportEvent {
        ReportEvent("message_accepted", [
            JSONField("message_id", .string(messageID)), JSONField("recipient", .string(recipient)),
            JSONField("server_time", .unsigned(serverTime)), JSONField("accept_ms", .milliseconds(elapsed)),
        ], text: "message \(Format.short(messageID)) to \(recipient) accepted by the server after \(Format.milliseconds(elapsed))")
    }

    static func delivered(_ receipt: DeliveryReceipt, elapsed: Duration?) -> ReportEvent {
        ReportEvent("delivered", [
            JSONField("message_id", .string(receipt.messageID)), JSONField("recipient", .string(receipt.recipient)),
            JSONField("recipient_device", .string(receipt.recipientDevice)), JSONField("server_time", .unsigned(receipt.serverTime)),
            JSONField("delivered_ms", .milliseconds(elapsed)),
        ], text: "message \(Format.short(receipt.messageID)) delivered to \(receipt.recipient)@\(receipt.recipientDevice)"
            + (elapsed.map { " after \(Format.milliseconds($0))" } ?? ""))
    }

    static func pushRegistered(_ options: PushRegisterOptions, serverTime: UInt64, elapsed: Duration) -> ReportEvent {
        ReportEvent("push_registered", [
            JSONField("kind", .string(options.kind.platform)), JSONField("token_bytes", .integer(Int64(options.token.count))),
            JSONField("environment", .optional(options.environment?.rawValue)), JSONField("topic", .optional(options.topic)),
            JSONField("server_time", .unsigned(serverTime)), JSONField("register_ms", .milliseconds(elapsed)),
        ], text: "\(options.token.isEmpty ? "unregistered" : "registered") push token of kind \(options.kind)"
            + (options.token.isEmpty ? "" : " (\(options.token.count) bytes)")
            + (options.environment.map { ", \($0)" } ?? "") + (options.topic.map { ", topic \($0)" } ?? "")
            + " after \(Format.milliseconds(elapsed))")
    }

    static func warning(_ text: String) -> ReportEvent {
        ReportEvent("warning", [JSONField("message", .string(text))], text: "warning: \(text)")
    }

    static func result(_ outcome: Outcome, _ fields: [JSONField]) -> ReportEvent {
        ReportEvent("result", [
            JSONField("status", .string(outcome.status.description)), JSONField("exit_code", .integer(Int64(outcome.status.rawValue))),
            JSONField("reason", .string(outcome.reason)),
        ] + fields, text: outcome.status == .ok ? outcome.reason : nil)
    }

    private static func mediaNote(_ media: Result<MediaDescription, MediaDescription.ParseError>) -> String {
        switch media {
        case .success(let description): return ", peer probe socket \(description.endpoint)"
        case .failure(let error): return " (no probe: \(error))"
        }
    }
}

/// Text for connection states (status lines, the prompt, `connection` events).
enum ConnectionStateText {
    /// A word for scripts and the prompt, and a detail for people.
    static func describe(_ state: ConnectionState) -> (word: String, detail: String) {
        switch state {
        case .disconnected: return ("disconnected", "")
        case .connecting(let attempt): return ("connecting", attempt > 1 ? "attempt \(attempt)" : "")
        case .connected(let info): return ("connected", "\(info.localAddress) -> \(info.remoteAddress)")
        case .waitingToReconnect(let delay, let reason):
            return ("reconnecting", "in \(Format.seconds(delay)): \(reason)")
        case .stopped(let reason): return ("stopped", "\(reason)")
        }
    }
}

enum CallEndText {
    static func describe(_ reason: CallEndReason, peer: String) -> String {
        switch reason {
        case .hungUp: return "\(peer) hung up"
        case .cancelled: return "\(peer) cancelled"
        case .declined: return "\(peer) declined"
        case .busy: return "\(peer) is busy"
        case .unreachable: return "\(peer) is unreachable (no device online)"
        case .noAnswer: return "no answer (rang out)"
        case .answeredElsewhere: return "answered on another device"
        case .declinedElsewhere: return "declined on another device"
        case .peerDisconnected: return "\(peer)'s device disconnected"
        }
    }
}

enum ProbeText {
    static func describe(_ statistics: ProbeStatistics, peer: UDPEndpoint) -> String {
        var text = "media probe to \(peer): \(statistics.received)/\(statistics.sent) echoes, loss \(Format.percent(statistics.lossPercent)) %"
        if let minimum = statistics.minimumRoundTrip, let average = statistics.averageRoundTrip,
           let maximum = statistics.maximumRoundTrip, let jitter = statistics.jitter {
            text += String(format: ", rtt min/avg/max %.3f/%.3f/%.3f ms, jitter %.3f ms",
                           minimum.seconds * 1000, average.seconds * 1000, maximum.seconds * 1000, jitter.seconds * 1000)
        }
        return text
    }
}
