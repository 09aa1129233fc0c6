import SignalingSupport
import Synchronization

// Locks of this file (docs/ARCHITECTURE.md, "Locks"): `perAddress` and `bucket` are
// leaves, each taken by any loop under its own `ownership` (per accept, close and HELLO),
// never both at once and never under a routing shard; their holds are timed
// (`SharedLock.admissionPerAddress`, `.admissionBucket`).

/// Decides which new connections and handshakes the server takes on, shared by all loops:
/// a cap on connections per IP address, and a token bucket pacing handshakes so that a
/// reconnect storm cannot starve the devices that are already connected.
final class AdmissionControl: Sendable {
    private let perAddress = Mutex<[UInt32: Int32]>([:])
    private let bucket: Mutex<TokenBucket>
    /// Both limits may change at run time (`update`, on SIGHUP).
    private let maxPerAddress: Atomic<Int32>

    init(maxConnectionsPerAddress: Int, handshakeRate: Int, now: Instant) {
        maxPerAddress = Atomic(Int32(clamping: maxConnectionsPerAddress))
        bucket = Mutex(TokenBucket(rate: Double(handshakeRate), burst: Double(handshakeRate), now: now))
    }

    /// The cap on connections from one address now in force.
    var maxConnectionsPerAddress: Int { Int(maxPerAddress.load(ordering: .relaxed)) }

    /// Puts new limits in force. Connections already open stay, even above a lowered cap;
    /// a new handshake rate starts with a full bucket.
    func update(maxConnectionsPerAddress: Int, handshakeRate: Int, now: Instant) {
        maxPerAddress.store(Int32(clamping: maxConnectionsPerAddress), ordering: .relaxed)
        bucket.withLock(timing: .admissionBucket) { bucket in
            guard bucket.rate != Double(handshakeRate) else { return }
            bucket = TokenBucket(rate: Double(handshakeRate), burst: Double(handshakeRate), now: now)
        }
    }

    /// Counts a new connection from `address` (a hash of its IP); false if over the cap,
    /// in which case nothing was counted.
    func admitConnection(from address: UInt32) -> Bool {
        perAddress.withLock(timing: .admissionPerAddress) { counts in
            let current = counts[address, default: 0]
            guard current < maxPerAddress.load(ordering: .relaxed) else { return false }
            counts[address] = current + 1
            return true
        }
    }

    func releaseConnection(from address: UInt32) {
        perAddress.withLock(timing: .admissionPerAddress) { counts in
            guard let current = counts[address] else { return }
            counts[address] = current > 1 ? current - 1 : nil
        }
    }

    /// Takes a handshake token; false means "tell the client to come back later".
    func admitHandshake(now: Instant) -> Bool {
        bucket.withLock(timing: .admissionBucket) { $0.tryTake(now: now) }
    }
}
