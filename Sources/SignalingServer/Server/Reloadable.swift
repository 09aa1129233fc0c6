import Synchronization

// Lock of this file (docs/ARCHITECTURE.md, "Locks"): `current`, a leaf held for the copy
// of a value: by the thread that reloads (rare), by each loop once after each reload, by
// rare readers off the loops. Not taken on a loop's per-handshake path while nothing was
// reloaded: there a loop reads one atomic word that only a reload writes.

/// A value every loop reads per handshake and a reload (SIGHUP) replaces, rarely: the
/// token verifier, the TLS context (`ServerContext`).
///
/// Each loop keeps its own `Copy` (the value and the generation it was taken at) and
/// reads through it (`read(through:)`): one acquiring load of `generation`, a word that
/// only `replace` writes, so its cache line stays shared by every core and is never
/// bounced; only when the generation moved does the loop take the lock, once, to copy
/// the new value. A reload is seen by each loop at its first read after `replace`
/// returned. Cost of that: a loop's copy keeps the previous value alive until its next
/// read (for a TLS context, OpenSSL counts its references anyway: open connections keep
/// theirs).
final class Reloadable<Value: Sendable>: Sendable {
    /// A loop's copy of the value, and the generation it is of (loop-owned; never shared).
    struct Copy: Sendable {
        fileprivate(set) var generation: UInt64
        fileprivate(set) var value: Value
    }

    /// The value in force, with its generation (changed together, under the lock).
    private let current: Mutex<Copy>
    /// `current.generation`, readable without the lock.
    private let generation = Atomic<UInt64>(1)

    init(_ value: Value) {
        current = Mutex(Copy(generation: 1, value: value))
    }

    /// The value in force (any thread; takes the lock).
    var value: Value { copy().value }

    /// A copy to read through, taken now (a loop's at its start).
    func copy() -> Copy { current.withLock { $0 } }

    /// Puts `value` in force: every later `read(through:)` returns it.
    func replace(with value: Value) {
        current.withLock { current in
            current = Copy(generation: current.generation + 1, value: value)
            // Releasing: a reader that sees the new generation then takes the lock anyway.
            generation.store(current.generation, ordering: .releasing)
        }
    }

    /// The value in force, from `copy` unless a reload replaced it since it was taken
    /// (then `copy` is refreshed, under the lock).
    @inline(__always)
    func read(through copy: inout Copy) -> Value {
        if generation.load(ordering: .acquiring) != copy.generation { copy = self.copy() }
        return copy.value
    }
}
