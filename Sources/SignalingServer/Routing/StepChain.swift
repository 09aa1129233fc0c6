import SignalingProtocol
import SignalingSupport
import Synchronization

/// What every step of one operation carries while its steps run on the loops that own
/// their shards (docs/ARCHITECTURE.md, "Routing shards"): where the request's answer goes,
/// the commit group its steps' units join, and how many of its steps are still to run.
///
/// A step may run on any loop, and the last one to finish is the one that closes the
/// group and, if no step answered, answers with an internal error; which loop that is
/// depends on the order the loops run in, so the count is atomic and the answer is
/// decided once (`decide`). Everything else is set when the operation starts and never
/// changes, so the chain is a plain `Sendable` value to every loop. With shards on other
/// nodes it would be an id in a table of the requesting node, the count kept there.
final class StepChain: Sendable {
    /// The time the operation started: every step sets its deadlines from it, as when all
    /// of them ran in one call.
    let now: Instant
    /// Wall-clock time events created by the steps are stamped with.
    let wall: UInt64
    /// The connection and request a step's answer goes to (nil: the operation's first
    /// hold answered, or no request waits: receipts, expiry).
    let requester: Requester?
    /// With a store, the group every step's commit unit joins; closed once the last step
    /// has run, so the writer commits the operation's units in one transaction.
    let group: CommitGroup?
    /// With a store, the deferred OK of a message (also `group`): every step ties its unit
    /// to it and records the message's events it queued (`DeferredReply.add`), and the
    /// store writer answers an accepted message after the commit.
    let message: DeferredReply?
    /// The operation expects its answer from a step (a message's hand-off, or a request
    /// whose first hold did not answer): if no step gives one, the last step answers with
    /// an internal error, so every request gets exactly one answer.
    let awaitsAnswer: Bool
    /// The writer answers an accepted message (`message` with a running store writer);
    /// false: the step that accepts it answers.
    private let writerAnswers: Bool
    /// Steps handed on and not yet run; the step that brings it to 0 finishes the chain.
    private let outstanding = Atomic<Int>(0)
    /// Set by the first decision (`decide`): exactly one answer per request.
    private let answered = Atomic<Bool>(false)

    /// A request's answer on its way to the requesting connection's loop.
    struct Requester: Sendable {
        let connection: ConnectionRef
        let requestID: UInt32

        /// The task that sends `outcome` on the connection.
        func reply(_ outcome: Result<UInt64, RequestError>) -> LoopTask {
            .reply(connection, Frame.answer(to: requestID, outcome))
        }
    }

    /// - Parameter awaitsAnswer: a step decides the answer (else the operation's first hold
    ///   did, or nobody asked); true whenever `requester` is set.
    init(
        now: Instant, wall: UInt64, requester: Requester?, group: CommitGroup?, message: DeferredReply? = nil,
        awaitsAnswer: Bool = false, writerAnswers: Bool = false
    ) {
        self.now = now
        self.wall = wall
        self.requester = requester
        self.awaitsAnswer = awaitsAnswer || requester != nil
        self.group = message ?? group
        self.message = message
        self.writerAnswers = message != nil && writerAnswers
    }

    /// `count` more steps were handed on.
    func expect(_ count: Int) {
        if count != 0 { outstanding.wrappingAdd(count, ordering: .relaxed) }
    }

    /// A step handed on was merged into another of this chain not run yet
    /// (`PostedStep.absorb`): it will not run. Never the last: the step it joined is
    /// still to run.
    func stepMerged() {
        outstanding.wrappingSubtract(1, ordering: .relaxed)
    }

    /// One step has run (after `expect` counted the steps it handed on): true when it was
    /// the last, so the caller finishes the chain (`Switchboard.finish`).
    func stepRan() -> Bool {
        outstanding.wrappingSubtract(1, ordering: .acquiringAndReleasing).newValue == 0
    }

    /// Takes a step's decision: returns the answer to send now, or nil when another step
    /// decided first, or when the store writer answers (an accepted message, OK after the
    /// commit). A message refused by a step is settled `declined` here, before the chain
    /// closes its group, so the writer commits its units as they are without answering; if
    /// the writer refused it first (store timeout, stop), that answer stands.
    func decide(_ outcome: Result<UInt64, RequestError>) -> Result<UInt64, RequestError>? {
        guard !answered.exchange(true, ordering: .acquiringAndReleasing) else { return nil }
        guard writerAnswers, let message else { return outcome }
        guard case .failure = outcome else { return nil }
        return message.settle(.declined) ? outcome : nil
    }
}

/// A step on its way to the loop that owns its user's shard (`LoopTask.steps`).
struct PostedStep: Sendable {
    private(set) var step: ShardStep
    let chain: StepChain
    /// The shard of `step.user`, hashed once when the step is handed on (`Switchboard.route`)
    /// and carried with it, not hashed again by every hold that runs it.
    let shard: Int

    init(step: ShardStep, chain: StepChain, shard: Int) {
        self.step = step
        self.chain = chain
        self.shard = shard
    }

    /// Takes `next`, the step handed on right after this one to the same loop, into this
    /// one when both are receipts for the same sender in the same chain and the batch
    /// stays within `limit` receipts: the receipts run in the same order, in one step
    /// (`EventLoop.postStep`). Then `next` is counted out of its chain, where this step
    /// stands for it (`StepChain.stepMerged`). Returns whether it did.
    mutating func absorb(_ next: PostedStep, upTo limit: Int) -> Bool {
        guard case .receipts(let more) = next.step, isReceipts(of: more.sender, in: next.chain),
            hasRoom(for: more.receipts.count, upTo: limit), case .receipts(var batch) = step
        else { return false }
        // A placeholder while `batch` is out, so that its array has one reference and the
        // append does not copy it (as `[ShardStep].handOn(_:for:shard:)` does).
        step = .continueAcknowledgement(user: batch.sender, id: 0)
        batch.receipts += more.receipts
        step = .receipts(batch)
        chain.stepMerged()
        return true
    }

    /// Whether this step is a batch of `sender`'s receipts handed on in `chain`
    /// (`absorb`, `EventLoop.postReceipt`).
    func isReceipts(of sender: String, in chain: StepChain) -> Bool {
        guard chain === self.chain, case .receipts(let batch) = step else { return false }
        return batch.sender == sender
    }

    /// Whether a batch of receipts (`isReceipts`) has room for `count` more within `limit`.
    func hasRoom(for count: Int, upTo limit: Int) -> Bool {
        guard case .receipts(let batch) = step else { return false }
        return batch.receipts.count + count <= limit
    }

    /// Appends `receipt` to this batch of receipts (`isReceipts`, `hasRoom`): as `absorb`
    /// takes in a step of one receipt, with no step made.
    mutating func add(_ receipt: consuming ReceiptBatch.Receipt) {
        guard case .receipts(var batch) = step else { preconditionFailure("a receipt added to \(step)") }
        step = .continueAcknowledgement(user: batch.sender, id: 0)  // as in `absorb`
        batch.receipts.append(receipt)
        step = .receipts(batch)
    }
}

extension Frame {
    /// OK (with its server time) or ERROR for request `requestID`.
    static func answer(to requestID: UInt32, _ outcome: Result<UInt64, RequestError>) -> Frame {
        switch outcome {
        case .success(let time): .ok(requestID: requestID, serverTime: time)
        case .failure(let error): .error(requestID: requestID, code: error.code, message: error.message)
        }
    }
}
