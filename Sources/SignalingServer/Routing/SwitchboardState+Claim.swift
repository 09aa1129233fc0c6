import SignalingProtocol
import SignalingSupport

/// A device taking the messages held for its user (`UserActivity.held`: they arrived while
/// the server knew none of the user's devices), a chunk per hold of the user's shard
/// (`SwitchboardConfiguration.fanOutChunk` events, the fan-out's constant): the handshake's
/// hold claims the first chunk, and `ShardStep.continueClaim` steps the rest, each picking
/// up at the front of the held list (docs/ARCHITECTURE.md, "Routing shards"). A claim of
/// `maxPendingEvents` (10,000) held messages took one hold of about 4 ms
/// (docs/LOAD-TESTING.md, "Bounded holds"); a chunk stays under 100 µs.
///
/// Invariants:
/// - Order: the device gets the held messages in the order they were held (the chunks
///   take them from the front of the list, in order), and every message for the user that
///   arrives while the claim is unfinished after all of them: such a message waits for the
///   claim, helping it along meanwhile (each of its holds claims the next chunk, then the
///   message tries again in a hold of its own), as messages to a user wait for a fan-out
///   in progress (`FanOut`; among themselves, waiting messages keep the order that gives).
///   The same holds after a restart that found held messages for a user with devices (a
///   claim cut short): the next message for the user starts a claim for the user's newest
///   device and waits for it. Call invitations and receipts are not held back: a call
///   rings the claiming device at once.
/// - The held messages go to one device, the one whose handshake found them (as when the
///   claim took one hold); a device of the user connecting meanwhile gets none of them,
///   and the messages that waited for the claim. If the claiming device is forgotten
///   meanwhile, the user's newest device claims the rest (none: the rest stays held for
///   the next device). A disconnect changes nothing: the device's queue takes the rest.
/// - A held message cancelled meanwhile (refused by the store) is skipped when its chunk
///   comes; one expired meanwhile (`expire`, from the front) is no longer there.
/// - With a store, each chunk's changes are a commit unit of their own, committed chunk by
///   chunk, never in a group with the message whose hold helped (`commitsAlone`): each unit
///   copies its chunk's events to the device (`claimHeldEvent`) and releases the held ones
///   through the chunk's last ordinal (`releaseHeld`), nothing beyond, in one transaction;
///   the units reach the writer in the shard's order. So after a crash the store has the
///   claimed chunks in the device's queue and the rest still held, never an event in both
///   or in neither: nothing acknowledged is lost or delivered again, and the rest is
///   claimed by the user's next handshake (or message) after the restart. One group for
///   the whole claim would be correct too, but would keep every chunk from the device
///   until the last one's commit (`--delivery after-commit`), and a refused group would
///   have to undo claims already written.
struct HeldClaim {
    /// Names the claim in its steps (a step of a claim that ended does nothing).
    let id: UInt64
    /// Where the held messages go.
    var device: DeviceRecord
}

extension UserActivity {
    /// `device` was unlinked from the user's list: if it was claiming the held messages,
    /// `next` (the user's newest device) takes the rest, or, with none, they stay held.
    func claimingDeviceForgotten(_ device: DeviceRecord, next: DeviceRecord?) {
        guard claim?.device === device else { return }
        if let next { claim?.device = next } else { claim = nil }
    }
}

extension SwitchboardState {
    /// Starts `device`'s claim of the messages held for its user, if any wait and no claim
    /// is in progress: claims the first chunk in this hold and returns the step that claims
    /// the rest (nil: nothing left).
    mutating func startClaim(_ activity: UserActivity, for device: DeviceRecord, into effects: inout [SwitchboardEffect]) -> ShardStep? {
        guard !activity.held.isEmpty, activity.claim == nil else { return nil }
        beginClaim(activity, for: device)
        return claimChunk(activity, user: device.userID, into: &effects)
    }

    /// Makes `device` the one claiming the user's held messages, under a new claim id.
    private mutating func beginClaim(_ activity: UserActivity, for device: DeviceRecord) {
        nextClaimID += 1
        activity.claim = HeldClaim(id: nextClaimID, device: device)
    }

    /// The next chunk of claim `id` of `user`'s held messages; nothing if the claim is over
    /// (finished by the holds of messages that waited for it, or its device forgotten).
    mutating func continueClaim(_ user: String, id: UInt64, into effects: inout [SwitchboardEffect]) -> StepOutcome {
        guard let activity = activities[user], activity.claim?.id == id else { return StepOutcome(reply: nil) }
        return StepOutcome(reply: nil, next: claimChunk(activity, user: user, into: &effects).map { [$0] } ?? [])
    }

    /// Whether a message to `user` must wait for a claim of held messages: messages are
    /// held for a user that has a device (a claim is in progress, or was cut short by a
    /// restart; a claim lasts until the list is empty).
    func awaitsClaim(_ user: String) -> Bool {
        guard let activity = activities[user], !activity.held.isEmpty else { return false }
        return awaitsClaim(activity, devices(of: user))
    }

    /// `awaitsClaim(_:)` with the user's activity and devices looked up already (no hash
    /// of its id).
    func awaitsClaim(_ activity: UserActivity?, _ devices: DeviceList) -> Bool {
        guard let activity, !activity.held.isEmpty else { return false }
        return devices.first != nil
    }

    /// A message to a user whose held messages are being claimed (`awaitsClaim`) waits:
    /// this hold claims the next chunk (starting a claim for the user's newest device if
    /// none is in progress), committed on its own, and the message tries again in a hold
    /// of its own.
    mutating func helpClaim(of user: String, before message: ShardStep, into effects: inout [SwitchboardEffect]) -> StepOutcome {
        commitsAlone()
        if let activity = activities[user] {
            if activity.claim == nil, let newest = users[user] { beginClaim(activity, for: newest) }
            // The claim's own step (if it has one) finds it over, or goes on.
            _ = claimChunk(activity, user: user, into: &effects)
        }
        return StepOutcome(reply: nil, next: [message])
    }

    /// Queues the next chunk of held messages to the claiming device, from the front of the
    /// list, and releases them in the store. Returns the step for the rest, nil when the
    /// list is empty (the claim is over).
    private mutating func claimChunk(_ activity: UserActivity, user: String, into effects: inout [SwitchboardEffect]) -> ShardStep? {
        guard let claim = activity.claim else { return nil }
        let count = min(activity.held.count, configuration.fanOutChunk)
        let sharesTracked = sharesTracked(.held(user), count: activity.held.count)
        // Slices of the one buffer: taking the chunk copies no event.
        let end = activity.held.startIndex + count
        let chunk = activity.held[..<end]
        activity.held = activity.held[end...]
        var ordinal = activity.firstHeldOrdinal
        for event in chunk {
            if event !== QueuedEvent.placeholder { counters.pendingEvents -= 1 }  // again as it is enqueued
            if !event.isCancelled {
                event.wasClaimed = true
                enqueue(event, to: claim.device, heldOrdinal: ordinal, into: &effects)
            }
            ordinal += 1
        }
        activity.firstHeldOrdinal = ordinal
        if sharesTracked {
            trackedSharesRemoved(Array(chunk), from: .held(user), count: activity.held.count, events: activity.forEachHeld)
        }
        if count > 0 { journal(.releaseHeld(user: user, through: ordinal - 1)) }
        guard activity.held.isEmpty else { return .continueClaim(user: user, id: claim.id) }
        activity.held = []  // frees the slice's buffer
        activity.claim = nil
        compactActivity(user)
        return nil
    }
}
