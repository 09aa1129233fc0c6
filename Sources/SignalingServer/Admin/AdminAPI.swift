import Foundation
import SignalingProtocol
import SignalingPush
import SignalingSupport

/// Whether the server should receive traffic (`/readyz`), and if not, why.
struct Readiness: Sendable {
    var listening = false
    var draining = false
    var storeHealthy = true
    /// The node lost its store lease and is stepping down (docs/CLUSTER.md).
    var leaseLost = false
    /// Waiting for the store lease: why this node does not serve (docs/CLUSTER.md).
    var standby: String?
    /// A front that cannot relay devices now: why (docs/CLUSTER.md, "Fronts").
    var noRoute: String?

    var isReady: Bool { listening && !draining && storeHealthy && !leaseLost && standby == nil && noRoute == nil }

    /// Why `/readyz` answers 503 (empty when ready).
    var reasons: [String] {
        var reasons: [String] = []
        if let standby { reasons.append("standby: \(standby)") }
        if let noRoute { reasons.append("front: \(noRoute)") }
        if !listening && standby == nil { reasons.append("not listening") }
        if draining { reasons.append("draining") }
        if leaseLost { reasons.append("lost the store lease") }
        if !storeHealthy { reasons.append("store unhealthy") }
        return reasons
    }
}

/// The admin API's endpoints (docs/ADMIN-API.md): health, metrics and the backend calls.
/// Runs on the admin thread; the backend calls hold the routing shards they need (each
/// hold handed to the shard's owner loop while it runs, which the admin thread waits for:
/// `Switchboard.withState`), and hand what they cause (events to write, connections to
/// close) to the loops.
final class AdminAPI: AdminRequestHandler {
    let context: ServerContext
    let writer: StoreWriter?
    let pushGateway: PushGateway?
    let loops: [EventLoop]
    private let token: [UInt8]?
    let readiness: @Sendable () -> Readiness
    /// The thread placement in force (fixed at start): `voipserver_thread_cpus`.
    let threadPlacement: (source: ThreadPlacement.Source, threads: [(thread: String, cpus: String)])

    /// The sender's device id in messages from the admin API.
    static let systemDevice = "admin"
    /// The sender when a request names none.
    static let defaultSender = "system"

    init(
        context: ServerContext, writer: StoreWriter?, pushGateway: PushGateway?, loops: [EventLoop], token: String?,
        threadPlacement: (source: ThreadPlacement.Source, threads: [(thread: String, cpus: String)]),
        readiness: @escaping @Sendable () -> Readiness
    ) {
        self.threadPlacement = threadPlacement
        self.context = context
        self.writer = writer
        self.pushGateway = pushGateway
        self.loops = loops
        self.token = token.map { Array($0.utf8) }
        self.readiness = readiness
    }

    func handle(_ request: AdminRequest, respond: @escaping @Sendable (AdminResponse) -> Void) {
        let segments = request.path.split(separator: "/", omittingEmptySubsequences: false).dropFirst().map(String.init)
        // Probes carry no credentials (load balancers, kubelets): they reveal nothing.
        switch segments {
        case ["healthz"]:
            return respond(Self.allowing(request, [.get, .head]) ?? .text(200, "ok\n"))
        case ["readyz"]:
            return respond(Self.allowing(request, [.get, .head]) ?? ready())
        default:
            break
        }
        if let refusal = Self.authenticate(request, token: token) { return respond(refusal) }
        switch segments {
        case ["metrics"]:
            respond(Self.allowing(request, [.get, .head]) ?? AdminResponse(
                status: 200, contentType: PrometheusText.contentType, body: Array(metrics().utf8)))
        case ["v1", "messages"]:
            if let refusal = Self.allowing(request, [.post]) { return respond(refusal) }
            sendMessage(request.body, respond: respond)
        case let path where path.count == 4 && path[0] == "v1" && path[1] == "users" && path[3] == "devices":
            guard let user = Self.identifier(path[2]) else { return respond(Self.badIdentifier(path[2])) }
            respond(Self.allowing(request, [.get]) ?? devices(of: user))
        case let path where path.count == 5 && path[0] == "v1" && path[1] == "users" && path[3] == "devices":
            guard let user = Self.identifier(path[2]) else { return respond(Self.badIdentifier(path[2])) }
            guard let device = Self.identifier(path[4]) else { return respond(Self.badIdentifier(path[4])) }
            respond(Self.allowing(request, [.delete]) ?? revoke(user: user, device: device))
        case let path where path.count == 3 && path[0] == "v1" && path[1] == "users":
            guard let user = Self.identifier(path[2]) else { return respond(Self.badIdentifier(path[2])) }
            respond(Self.allowing(request, [.delete]) ?? forget(user: user))
        default:
            respond(Self.error(404, "notFound", "no such endpoint: \(request.path)"))
        }
    }

    // MARK: Authentication

    /// Nil when the request may proceed: no token is configured (loopback only, checked
    /// at start), or it carries `Authorization: Bearer <token>`. Compared in constant time.
    static func authenticate(_ request: AdminRequest, token: [UInt8]?) -> AdminResponse? {
        guard let token else { return nil }
        let prefix = "Bearer "
        guard let header = request.authorization, header.hasPrefix(prefix) else {
            return Self.error(401, "unauthorized", "this endpoint needs 'Authorization: Bearer <token>'")
        }
        let given = Array(header.utf8.dropFirst(prefix.utf8.count))
        var difference = UInt8(given.count == token.count ? 0 : 1)
        for index in 0..<token.count { difference |= token[index] ^ (index < given.count ? given[index] : 0) }
        return difference == 0 ? nil : Self.error(401, "unauthorized", "the bearer token is wrong")
    }

    // MARK: Health

    private func ready() -> AdminResponse { Self.ready(readiness()) }

    static func ready(_ state: Readiness) -> AdminResponse {
        json(state.isReady ? 200 : 503, ["ready": state.isReady, "reasons": state.reasons])
    }

    // MARK: Backend calls

    private func sendMessage(_ body: [UInt8], respond: @escaping @Sendable (AdminResponse) -> Void) {
        let message: OutgoingMessage, sender: String
        switch Self.parseMessage(body, maxBodyBytes: context.configuration.maxFrameLength - 1024) {
        case .failure(let refusal): return respond(refusal)
        case .success(let parsed): (message, sender) = parsed
        }
        if let writer, !writer.isHealthy {
            return respond(Self.error(503, "storeUnavailable", "the store is unavailable; retry later"))
        }
        let now = context.now()
        let storeTimeout = context.configuration.storeTimeout
        let messageID = message.messageID
        let answer: @Sendable (Result<UInt64, RequestError>, Bool) -> AdminResponse = { outcome, duplicate in
            switch outcome {
            case .success(let serverTime):
                return Self.json(200, ["messageId": messageID, "serverTime": serverTime, "duplicate": duplicate])
            case .failure(let error):
                return Self.refusal(error)
            }
        }
        let wall = context.wallMilliseconds()
        // Whether the recipient is known is its shard's to say: a hold of its own, before
        // the sender's (a user it learns of in between is as if it came after).
        let known = context.switchboard.withState(of: message.recipient, wall: wall) { $0.knows(message.recipient) }
        guard known else {
            return respond(Self.error(404, "unknownUser", "the server knows no device of \(message.recipient)"))
        }
        var handOff: (step: ShardStep, deferred: DeferredReply?)?
        let (immediate, effects) = context.switchboard.withState(of: sender, wall: wall) { board -> (AdminResponse?, [SwitchboardEffect]) in
            var effects: [SwitchboardEffect] = []
            switch board.send(message, sender: sender, senderDevice: Self.systemDevice, sendingDevice: nil, now: now, into: &effects) {
            case .success(let acceptance):
                // As for a device: "accepted" is a promise, answered once committed.
                let deferred = board.deferReply(of: acceptance) {
                    DeferredReply(
                        target: .completion { outcome in respond(answer(outcome, false)) }, serverTime: acceptance.serverTime,
                        sender: sender, messageID: message.messageID, deadline: now + storeTimeout)
                }
                if let step = acceptance.handOff {
                    handOff = (step, deferred)
                    return (nil, effects)
                }
                guard deferred != nil else {
                    return (answer(.success(acceptance.serverTime), acceptance.event == nil), effects)
                }
                return (nil, effects)
            case .failure(let error):
                return (answer(.failure(error), false), effects)
            }
        }
        LoopDispatch.post(LoopDispatch.tasks(for: effects, context: context), to: loops)
        if let handOff {
            // The recipient's shard queues or refuses the message; with a store the OK
            // waits for the commit of every step (the completion answers then).
            let (reply, stepEffects) = context.switchboard.runMessage(handOff.step, deferring: handOff.deferred, now: now, wall: wall)
            LoopDispatch.post(LoopDispatch.tasks(for: stepEffects, context: context), to: loops)
            if let reply { respond(answer(reply, false)) }
            return
        }
        if let immediate { respond(immediate) }
    }

    private func devices(of user: String) -> AdminResponse {
        let now = context.now()
        let presence = context.switchboard.withState(of: user, wall: context.wallMilliseconds()) { $0.presence(of: user, now: now) }
        guard let presence else { return Self.error(404, "unknownUser", "the server knows no device of \(user)") }
        return Self.json(200, [
            "user": user,
            "devices": presence.map { device -> [String: Any] in
                ["device": device.deviceID, "online": device.online, "lastSeen": device.lastSeen, "pendingEvents": device.pendingEvents]
            },
        ])
    }

    private func revoke(user: String, device: String) -> AdminResponse {
        let (outcome, effects) = context.switchboard.withState(of: user, wall: context.wallMilliseconds()) { board in
            var effects: [SwitchboardEffect] = []
            return (board.revokeSession(user: user, device: device, into: &effects), effects)
        }
        LoopDispatch.post(LoopDispatch.tasks(for: effects, context: context), to: loops)
        switch outcome {
        case .success:
            context.logger.info("admin_session_revoked", ["user": user, "device": device, "was_online": !effects.isEmpty])
            return Self.json(200, ["user": user, "device": device, "revoked": true, "disconnected": !effects.isEmpty])
        case .failure(let refusal):
            return Self.notFound(refusal)
        }
    }

    private func forget(user: String) -> AdminResponse {
        let now = context.now()
        let wall = context.wallMilliseconds()
        let (outcome, next, effects) = context.switchboard.withState(of: user, wall: wall) { board in
            var effects: [SwitchboardEffect] = []
            let (outcome, next) = board.forgetUser(user, now: now, into: &effects)
            return (outcome, next, effects)
        }
        LoopDispatch.post(LoopDispatch.tasks(for: effects, context: context), to: loops)
        // The user's calls end for their other parties in their shards.
        let chain = StepChain(now: now, wall: wall, requester: nil, group: nil)
        LoopDispatch.post(LoopDispatch.tasks(for: context.switchboard.run(next, chain: chain).effects, context: context), to: loops)
        switch outcome {
        case .success(let removed):
            context.logger.info("admin_user_forgotten", ["user": user, "devices": removed])
            return Self.json(200, ["user": user, "forgotten": true, "devicesRemoved": removed])
        case .failure(let refusal):
            return Self.notFound(refusal)
        }
    }

    // MARK: Parsing

    /// The message and its sender from a `POST /v1/messages` body, or the 4xx to answer.
    static func parseMessage(_ body: [UInt8], maxBodyBytes: Int) -> Result<(OutgoingMessage, sender: String), AdminResponse> {
        let object: [String: Any]
        do {
            guard let parsed = try JSONSerialization.jsonObject(with: Data(body)) as? [String: Any] else {
                return .failure(error(400, "badRequest", "the body must be a JSON object"))
            }
            object = parsed
        } catch {
            return .failure(Self.error(400, "badJSON", "the body is not valid JSON"))
        }
        let known: Set<String> = ["to", "messageId", "body", "bodyBase64", "contentType", "from"]
        if let unknown = object.keys.sorted().first(where: { !known.contains($0) }) {
            return .failure(error(400, "badRequest", "unknown field '\(unknown)'"))
        }
        func text(_ key: String, required: Bool, limit: Int) -> Result<String?, AdminResponse> {
            guard let value = object[key] else {
                return required ? .failure(error(400, "badRequest", "'\(key)' is required")) : .success(nil)
            }
            guard let string = value as? String else { return .failure(error(400, "badRequest", "'\(key)' must be a string")) }
            guard !string.isEmpty, string.utf8.count <= limit else {
                return .failure(error(400, "badRequest", "'\(key)' must hold 1 to \(limit) bytes of UTF-8"))
            }
            return .success(string)
        }
        let fields: (to: String, id: String, type: String, from: String, body: [UInt8])
        do throws(AdminResponse) {
            let to = try text("to", required: true, limit: ProtocolLimits.maxIdentifierBytes).get()!
            let id = try text("messageId", required: true, limit: ProtocolLimits.maxIdentifierBytes).get()!
            let type = try text("contentType", required: false, limit: ProtocolLimits.maxShortTextBytes).get()
            let from = try text("from", required: false, limit: ProtocolLimits.maxIdentifierBytes).get()
            let plain = object["body"], encoded = object["bodyBase64"]
            guard (plain == nil) != (encoded == nil) else {
                return .failure(error(400, "badRequest", "give exactly one of 'body' (text) and 'bodyBase64'"))
            }
            var content: [UInt8]
            if let plain {
                guard let string = plain as? String else { return .failure(error(400, "badRequest", "'body' must be a string")) }
                content = Array(string.utf8)
            } else {
                guard let string = encoded as? String, let data = Data(base64Encoded: string) else {
                    return .failure(error(400, "badRequest", "'bodyBase64' must be a base64 string"))
                }
                content = Array(data)
            }
            guard content.count <= maxBodyBytes else {
                return .failure(error(413, "bodyTooLarge", "the message body may hold at most \(maxBodyBytes) bytes"))
            }
            fields = (to, id, type ?? (plain != nil ? "text/plain; charset=utf-8" : "application/octet-stream"), from ?? defaultSender, content)
        } catch {
            return .failure(error)
        }
        return .success((
            OutgoingMessage(messageID: fields.id, recipient: fields.to, contentType: fields.type, body: fields.body), fields.from))
    }

    /// A path segment, percent-decoded, if it is a valid id.
    static func identifier(_ segment: String) -> String? {
        guard let decoded = segment.removingPercentEncoding, !decoded.isEmpty,
              decoded.utf8.count <= ProtocolLimits.maxIdentifierBytes
        else { return nil }
        return decoded
    }

    // MARK: Responses

    static func allowing(_ request: AdminRequest, _ methods: [AdminRequest.Method]) -> AdminResponse? {
        methods.contains(request.method) ? nil : error(405, "methodNotAllowed", "this endpoint does not take that method")
    }

    static func badIdentifier(_ segment: String) -> AdminResponse {
        error(400, "badRequest", "'\(segment)' is not a valid id (1 to \(ProtocolLimits.maxIdentifierBytes) bytes of UTF-8, percent-encoded)")
    }

    static func notFound(_ refusal: AdminRefusal) -> AdminResponse {
        switch refusal {
        case .unknownUser(let user): return error(404, "unknownUser", "the server knows no device of \(user)")
        case .unknownDevice(let user, let device): return error(404, "unknownDevice", "\(user) has no device \(device)")
        }
    }

    /// A refused message, with its protocol error code: 429 for what a retry later may
    /// fix by itself (backlogs and rates), 503 for the server's own state.
    static func refusal(_ error: RequestError) -> AdminResponse {
        let status: Int
        switch error.code {
        case .recipientBacklogFull, .senderQuotaExceeded, .rateLimited: status = 429
        case .storeUnavailable, .capacityExceeded, .internalError: status = 503
        default: status = 400
        }
        return json(status, ["error": String(describing: error.code), "code": Int(error.code.rawValue), "message": error.message])
    }

    static func error(_ status: Int, _ code: String, _ message: String) -> AdminResponse {
        json(status, ["error": code, "message": message])
    }

    static func json(_ status: Int, _ object: [String: Any]) -> AdminResponse {
        let data = (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])) ?? Data("{}".utf8)
        return AdminResponse(status: status, contentType: "application/json", body: Array(data) + [0x0A])
    }
}
