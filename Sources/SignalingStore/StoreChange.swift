import SignalingProtocol
import SignalingSupport

/// One change to the durable state. The server collects the changes each operation makes
/// and hands them to the store in batches; a batch is applied atomically.
public enum StoreChange: Sendable, Equatable {
    /// Creates the device or updates its session id and last-seen time.
    case upsertDevice(user: String, device: String, sessionID: SessionID, lastSeen: UInt64)
    /// Adds an event to a device's queue and raises the device's `lastSeq` to its seq.
    /// The device exists (an `upsertDevice` for it came in this or an earlier batch).
    case appendEvent(user: String, device: String, event: StoredEvent)
    /// Deletes the device's events ≤ `through` and raises its `lastSeq` to `through` (its
    /// `ackedSeq` follows: `StoredDevice.ackedSeq`).
    case acknowledge(user: String, device: String, through: UInt64)
    /// Raises the device's `lastSeq` to `through` without an event: the server may hand
    /// numbers up to it to the device before their events are committed, and a restarted
    /// server continues after them, so no number is ever given to two events.
    case reserveSequence(user: String, device: String, through: UInt64)
    /// Deletes a device and everything stored for it (it expired).
    case removeDevice(user: String, device: String)
    /// Holds an event for a user that has no device yet (`event.seq` is its ordinal).
    case holdForUser(user: String, event: StoredEvent)
    /// Copies the user's held event `ordinal` to the device's queue as event `seq` (the
    /// device's first connection claims what was held for its user), body and all, from
    /// what the store holds: the server may no longer have the body in memory. Raises the
    /// device's `lastSeq` to `seq`. Nothing is copied if the held event is not stored (its
    /// message was refused).
    case claimHeldEvent(user: String, device: String, seq: UInt64, ordinal: UInt64)
    /// Deletes the user's held events with ordinal ≤ `through` (they were handed to a
    /// device, whose `appendEvent`s are in the same batch, or they expired).
    case releaseHeld(user: String, through: UInt64)
    /// Remembers a message id for de-duplication. The server remembers an id only while it
    /// holds no live record of it (never remembered, forgotten since, or expired: an expired
    /// record may stay stored, and a snapshot returns an id's latest record).
    case rememberMessageID(StoredMessageID)
    /// Forgets the record of a message id that `rememberMessageID` stored with this
    /// `serverTime` (it expired, was evicted, or its message was withdrawn). The server time
    /// finds the record: the SQLite store keeps ids in the order they were accepted, so that
    /// remembering and forgetting write the two ends of one B-tree, not a random page each
    /// (issue 16: apps' message ids are random UUIDs). The Redis store keeps one record per
    /// id and needs no server time. The server forgets only the record it holds.
    case forgetMessageID(sender: String, messageID: String, serverTime: UInt64)
    /// Stores one of the device's push registrations, replacing the device's earlier one
    /// of the same kind (`PushRegistration.kind`) and no other.
    case registerPush(user: String, device: String, registration: PushRegistration)
    /// Deletes the device's push registration of `kind`, if any (the device unregistered
    /// it, or the push service said the token is no longer valid).
    case removePush(user: String, device: String, kind: PushTokenKind)
    /// Deletes the device's event `seq` if it is still stored, and raises the device's
    /// `lastSeq` to `seq` as the `appendEvent` it undoes did (so the number is never given
    /// to another event). Undoes the event of a message that was refused at its deadline
    /// but whose commit completed after all.
    case withdrawEvent(user: String, device: String, seq: UInt64)
    /// Deletes the user's held event `ordinal` if it is still stored (a refused message's,
    /// as `withdrawEvent`).
    case withdrawHeld(user: String, ordinal: UInt64)
}

/// Why the store could not apply a batch. None of the batch was applied.
public struct StoreError: Error, Sendable, Equatable, CustomStringConvertible {
    public enum Kind: Sendable, Equatable {
        /// The disk or the configured size cap is full; retrying after space is freed works.
        case full
        /// The database cannot be written (read-only file system, permissions).
        case readOnly
        /// Another I/O error.
        case io
        /// The file is not a database of ours, or it is damaged.
        case corrupt
        /// Anything else (a bug, an unexpected SQLite result).
        case other
    }

    public var kind: Kind
    public var message: String

    public init(_ kind: Kind, _ message: String) {
        self.kind = kind
        self.message = message
    }

    public var description: String { "\(kind): \(message)" }
}

/// A store that hands back the bodies of the events it holds, so that the server need not
/// keep in memory the bodies of events that are not about to be written (docs/STORAGE.md,
/// "Bodies in memory"). Called from the store-writer thread only, between batches: it
/// sees every batch applied before.
public protocol EventBodySource: AnyObject, Sendable {
    /// The stored bodies of the device's events numbered `seq` and after, in order, at
    /// most `limit` of them.
    func bodies(user: String, device: String, from seq: UInt64, limit: Int) throws(StoreError) -> [(seq: UInt64, body: [UInt8])]
}

/// Where the server keeps what must survive a restart. The SQLite store is the default;
/// the protocol is small so that a distributed backend can replace it.
///
/// Threading: `loadSnapshot` is called once before the server starts; afterwards `apply`
/// is called from the server's single store-writer thread only, one batch at a time.
public protocol EventStore: AnyObject, Sendable {
    /// Everything stored, for rebuilding the server's state at start.
    func loadSnapshot() throws(StoreError) -> StoredSnapshot
    /// Applies the changes, in order, atomically: all or none.
    func apply(_ changes: [StoreChange]) throws(StoreError)
    /// Closes the store; no calls afterwards.
    func close()
    /// Threads the store runs of its own (SQLite's WAL checkpointer), for the server to
    /// place beside its store writer (`--thread-placement`). Fixed once the store is open;
    /// the handles are valid until `close`. Default: none.
    var backgroundThreads: [JoinableThread] { get }
}

extension EventStore {
    public var backgroundThreads: [JoinableThread] { [] }
}

extension StoreChange {
    /// What the change is about, for error messages (never bodies or tokens).
    public var summary: String {
        switch self {
        case .upsertDevice(let user, let device, _, _): return "upsertDevice \(user)/\(device)"
        case .appendEvent(let user, let device, let event): return "appendEvent \(user)/\(device) seq \(event.seq)"
        case .acknowledge(let user, let device, let through): return "acknowledge \(user)/\(device) through \(through)"
        case .reserveSequence(let user, let device, let through): return "reserveSequence \(user)/\(device) through \(through)"
        case .removeDevice(let user, let device): return "removeDevice \(user)/\(device)"
        case .holdForUser(let user, let event): return "holdForUser \(user) ordinal \(event.seq)"
        case .releaseHeld(let user, let through): return "releaseHeld \(user) through \(through)"
        case .rememberMessageID(let remembered): return "rememberMessageID \(remembered.sender)/\(remembered.messageID)"
        case .forgetMessageID(let sender, let messageID, _): return "forgetMessageID \(sender)/\(messageID)"
        case .registerPush(let user, let device, let registration): return "registerPush \(user)/\(device) \(registration.kind.rawValue)"
        case .removePush(let user, let device, let kind): return "removePush \(user)/\(device) \(kind.rawValue)"
        case .claimHeldEvent(let user, let device, let seq, let ordinal): return "claimHeldEvent \(user)/\(device) seq \(seq) ordinal \(ordinal)"
        case .withdrawEvent(let user, let device, let seq): return "withdrawEvent \(user)/\(device) seq \(seq)"
        case .withdrawHeld(let user, let ordinal): return "withdrawHeld \(user) ordinal \(ordinal)"
        }
    }

    /// The user whose data the change touches: the device's or held events' user, or for
    /// message ids the sender. Changes of different users never touch the same data, so a
    /// batch may be split by user, keeping each user's changes in order, and applied user
    /// by user with the same result (the Redis store's per-user hash tags rest on this).
    public var owner: String {
        switch self {
        case .upsertDevice(let user, _, _, _), .appendEvent(let user, _, _), .acknowledge(let user, _, _),
             .reserveSequence(let user, _, _), .removeDevice(let user, _), .holdForUser(let user, _),
             .releaseHeld(let user, _), .registerPush(let user, _, _), .removePush(let user, _, _), .claimHeldEvent(let user, _, _, _),
             .withdrawEvent(let user, _, _), .withdrawHeld(let user, _):
            return user
        case .rememberMessageID(let remembered): return remembered.sender
        case .forgetMessageID(let sender, _, _): return sender
        }
    }
}
