import SignalingProtocol
import SignalingSupport

/// Work one routing shard hands to another: the next step of an operation that spans
/// users (docs/ARCHITECTURE.md, "Routing shards").
///
/// A step is a plain value: it names users, devices and calls by their ids and carries
/// what the next shard needs, never a reference into a shard, so it crosses a loop's
/// inbox (`LoopTask.steps`, with its operation's `StepChain`) and could, with shards on
/// several nodes, cross a network. A shard runs a step for a user it holds at once, in the
/// same hold (`SwitchboardState.handOn`); a step for another shard's user is returned, and
/// `Switchboard.run` posts it to the loop that owns that shard, which runs it in a hold of
/// its own.
///
/// Size: the cases whose payload is larger than a batch of receipts or a chunk's id are
/// `indirect` (one box per step, made once), so that a step is the size of its largest
/// inline case (an id and an array or a number), not of a message: a step is copied several times on its way (handed on, gathered per
/// destination loop, pushed through the inbox, queued, run), and copying the message-sized
/// value was a fifth of the work a crossing step added (callgrind, issue 16). A message's
/// two steps carry a reference to one `MessageHandOff` instead of a box each.
///
/// Order: two steps one hold hands the same shard run in the order handed on (one FIFO
/// inbox per loop, each loop's posts in order). Steps of one operation that reach a
/// shard from different shards have no order between them; `toCaller` numbers its
/// notices for that reason.
enum ShardStep: Sendable, Equatable {
    /// A message its sender's shard admitted (no duplicate, within the sender's rate, its
    /// copies queued to the sender's other devices, awaiting this decision): for the
    /// recipient's shard to queue or refuse. The same object comes back in the settle step.
    case deliverMessage(MessageHandOff)
    /// The next chunk of a fan-out to a recipient with more devices than one hold takes
    /// (`FanOut`), run on the recipient's shard; the step that finds it finished answers.
    /// Or of a message's copies to its sender's other devices (`FanOut`, the sender's
    /// side), run on the sender's shard, which takes the message on to the recipient's.
    case continueFanOut(user: String, id: UInt64)
    /// The next chunk of an acknowledgement that covers more events than one hold takes
    /// (`Acknowledgement`), run on the shard of the acknowledging device's user.
    case continueAcknowledgement(user: String, id: UInt64)
    /// The next chunk of a device's claim of the messages held for its user (`HeldClaim`),
    /// run on the user's shard.
    case continueClaim(user: String, id: UInt64)
    /// The next chunk of the devices a call rings (`CallRecord.toRing`), run on the
    /// callee's shard.
    indirect case continueRing(callee: String, callID: String)
    /// The next chunk of an event for many devices of one user (`DeviceBroadcast`: a call's
    /// ending to the callee's devices), run on the user's shard.
    case continueBroadcast(user: String, id: UInt64)
    /// The recipient's shard queued (`accepted`) or refused the message: for the sender's
    /// shard, which releases its copies and remembers its id, or cancels them and frees it.
    case settleMessage(MessageHandOff, accepted: Bool)
    /// Devices of other shards' users acknowledged messages of one sender: the sender's
    /// devices get MESSAGE_DELIVERED for each, in the batch's order. One step per sender
    /// for all the receipts one hold of an acknowledgement made for it (not one per
    /// receipt): a crossing of shards costs a step's hold, inbox slot and chain count once
    /// per batch (docs/LOAD-TESTING.md, "Routing on more cores").
    case receipts(ReceiptBatch)
    /// A call from a device of another shard's user, for the callee's shard (the call
    /// lives there).
    indirect case invite(CallInvitation)
    /// The calling device asks the callee's shard to cancel or hang up its call.
    indirect case callerRequest(CallerRequest, callID: String, callee: String, caller: DeviceAddress)
    /// The calling device stayed away past its grace period (or its user was forgotten):
    /// for the callee's shard, which ends the call for the callee's devices
    /// (`callerVanished`).
    indirect case callerVanished(callID: String, callee: String, caller: DeviceAddress)
    /// What the callee's shard tells the caller's about a call: an event for the calling
    /// device, or that the call is over. Numbered per call from 1, so that the caller's
    /// shard applies them in the order the callee's shard decided them, whichever thread
    /// (or node) carried each (`OutgoingCall.nextNotice`).
    indirect case toCaller(CallerNotice, callID: String, caller: DeviceAddress, number: UInt32)

    /// The shard of `user` when the step carries it, so that routing the step hashes no id:
    /// a batch of receipts (its sender's, `DeliveryReceipt.senderShard`). Nil: `user` is
    /// hashed (`Switchboard.route`).
    var carriedShard: Int? {
        if case .receipts(let batch) = self { batch.senderShard } else { nil }
    }

    /// The user whose shard runs this step.
    var user: String {
        switch self {
        case .deliverMessage(let handOff): handOff.message.recipient
        case .settleMessage(let handOff, _): handOff.message.sender
        case .continueFanOut(let user, _): user
        case .continueAcknowledgement(let user, _): user
        case .continueClaim(let user, _): user
        case .continueRing(let callee, _): callee
        case .continueBroadcast(let user, _): user
        case .receipts(let batch): batch.sender
        case .invite(let invitation): invitation.callee
        case .callerRequest(_, _, let callee, _): callee
        case .callerVanished(_, let callee, _): callee
        case .toCaller(_, _, let caller, _): caller.user
        }
    }
}

/// A message on its way from its sender's shard to its recipient's (`ShardStep.deliverMessage`)
/// and back (`settleMessage`): one object, made by the sender's shard and handed back to it
/// by the recipient's with the decision, so that a message that crosses shards costs one
/// allocation, made and freed by the sender's loop, and no copy of the message. Two boxes
/// (the steps' `indirect` payloads) cost an allocation more, a copy of the message (a
/// retain of each of its strings and its body on the recipient's core), and each box was
/// freed by the loop that had not made it (docs/LOAD-TESTING.md, "Routing on more cores").
/// The recipient's loop usually lets go of it before it posts the settle step (the inbox
/// batch that ran the step ends before its callback posts), so the sender's loop frees it
/// (in `routing-bench scaling`, 94 % of them: `Tools/bench-shared-counts`).
final class MessageHandOff: Sendable, Equatable {
    let message: DeliveredMessage

    init(_ message: DeliveredMessage) {
        self.message = message
    }

    static func == (left: MessageHandOff, right: MessageHandOff) -> Bool {
        left === right || left.message == right.message
    }
}

/// Receipts for one sender, in the order their events were taken out of the recipients'
/// queues (`ShardStep.receipts`). Never empty.
struct ReceiptBatch: Sendable, Equatable {
    let sender: String
    var receipts: [Receipt]

    /// The shard of `sender`, as its receipts carry it (`DeliveryReceipt.senderShard`).
    var senderShard: Int { Int(receipts[0].receipt.senderShard) }

    /// One acknowledged message: what the sender's devices' MESSAGE_DELIVERED says.
    struct Receipt: Sendable, Equatable {
        let receipt: DeliveryReceipt
        let recipientDevice: String
        let serverTime: UInt64
    }
}

/// One device, by its ids (a step's way of naming a `DeviceRecord` of another shard).
struct DeviceAddress: Sendable, Hashable {
    let user: String
    let device: String

    init(_ user: String, _ device: String) {
        self.user = user
        self.device = device
    }

    init(_ record: DeviceRecord) {
        self.init(record.userID, record.deviceID)
    }

    func names(_ record: DeviceRecord) -> Bool { record.userID == user && record.deviceID == device }
}

/// A CALL_INVITE on its way from the caller's shard to the callee's.
struct CallInvitation: Sendable, Equatable {
    let callID: String
    let caller: DeviceAddress
    let callee: String
    let offer: [UInt8]
}

/// What the callee's shard tells the caller's about a call (`ShardStep.toCaller`).
enum CallerNotice: Sendable, Equatable {
    /// CALL_RANG, CALL_ACCEPTED or CALL_ENDED for the calling device.
    case event(Event)
    /// The call is over, or was never set up: the caller's shard forgets it.
    case closed
}

/// What a calling device may ask of its call.
enum CallerRequest: Sendable, Equatable {
    case cancel
    case hangUp
}

/// What one hold of a shard decided: the answer to the request that started the
/// operation, if this step is the one that decides it, and the steps other shards run next.
struct StepOutcome {
    /// OK (with its server time) or ERROR for the request; nil: another step answers.
    var reply: Result<UInt64, RequestError>?
    /// In the order they must run.
    var next: [ShardStep] = []
    /// The message event this hold queued (or held) for a message of another shard's
    /// sender (`deliverMessage`): with a store, the message's OK makes it durable and a
    /// refusal cancels it (`DeferredReply.add`).
    var queued: QueuedEvent? = nil

    static func answered(_ reply: Result<UInt64, RequestError>, next: [ShardStep] = []) -> StepOutcome {
        StepOutcome(reply: reply, next: next)
    }

    /// Takes on what a step run in the same hold decided (its reply, if this has none yet).
    mutating func merge(_ other: StepOutcome) {
        if reply == nil { reply = other.reply }
        if queued == nil { queued = other.queued }
        next += other.next
    }
}

extension SwitchboardState {
    /// Runs `step` now if this shard holds its user (returning what it hands on), or hands
    /// it on unchanged. Every step an operation produces goes through here, so an operation
    /// within one shard runs whole in one hold, as it did before shards. `now` is needed by
    /// the steps that set deadlines (`ShardStep.needsClock`); the others run without it.
    mutating func handOn(_ step: ShardStep, now: Instant? = nil, into effects: inout [SwitchboardEffect]) -> StepOutcome {
        guard shardMap.owns(step.user) else { return StepOutcome(reply: nil, next: [step]) }
        return handle(step, now: now, into: &effects)
    }

    /// Runs a step for a user this shard holds.
    mutating func handle(_ step: ShardStep, now: Instant?, into effects: inout [SwitchboardEffect]) -> StepOutcome {
        // Debug builds only: the caller knows the step's shard (`PostedStep.shard`), and
        // hashing its user again for every step cost 4 % of a crossing (perf, issue 16).
        assert(shardMap.owns(step.user), "step for \(step.user) on shard \(shardMap.index)")
        precondition(now != nil || !step.needsClock, "\(step) needs the clock")
        switch step {
        case .deliverMessage(let handOff):
            return deliverMessage(handOff, now: now!, into: &effects)
        case .continueFanOut(let user, let id):
            return continueFanOut(user, id: id, now: now!, into: &effects)
        case .continueAcknowledgement(let user, let id):
            return continueAcknowledgement(user, id: id, into: &effects)
        case .continueClaim(let user, let id):
            return continueClaim(user, id: id, into: &effects)
        case .continueRing(let callee, let callID):
            return continueRing(callee: callee, callID: callID, into: &effects)
        case .continueBroadcast(let user, let id):
            return continueBroadcast(user, id: id, into: &effects)
        case .settleMessage(let handOff, let accepted):
            return settleMessage(handOff.message, accepted: accepted, now: now!, into: &effects)
        case .receipts(let batch):
            return deliverReceipts(batch, into: &effects)
        case .invite(let invitation):
            return ring(invitation, now: now!, into: &effects)
        case .callerRequest(let request, let callID, _, let caller):
            return callerAsked(request, callID: callID, caller: caller, into: &effects)
        case .callerVanished(let callID, _, let caller):
            return callerVanished(callID: callID, caller: caller, into: &effects)
        case .toCaller(let notice, let callID, let caller, let number):
            receive(notice, callID: callID, caller: caller, number: number, into: &effects)
            return StepOutcome(reply: nil)
        }
    }
}

extension ShardStep {
    /// Whether the step is the next chunk of work split into bounded holds (a fan-out's
    /// devices, an ACK's events, a claim's held messages, a call's devices to ring, a call
    /// ending's devices): its owner runs it as a task of its own, not right after the
    /// chunk before it.
    var isNextChunk: Bool {
        switch self {
        case .continueFanOut, .continueAcknowledgement, .continueClaim, .continueRing, .continueBroadcast: true
        default: false
        }
    }

    /// Whether the step is a chunk of a `DeviceBroadcast` (its hold's unit may belong to
    /// another broadcast's group: it shares no hold with a store, `Switchboard.sharesHold`).
    var isBroadcastChunk: Bool {
        if case .continueBroadcast = self { true } else { false }
    }

    /// Whether the step sets a deadline (a held message's expiry, a message id's window,
    /// a ring timeout), so needs the current time.
    var needsClock: Bool {
        switch self {
        case .deliverMessage, .continueFanOut, .settleMessage, .invite: true
        case .receipts, .continueAcknowledgement, .continueClaim, .continueRing, .continueBroadcast, .callerRequest, .callerVanished, .toCaller: false
        }
    }
}
