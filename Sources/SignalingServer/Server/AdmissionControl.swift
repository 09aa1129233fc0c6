import SignalingSupport
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

// No lock in this file (docs/ARCHITECTURE.md, "Locks"): every loop admits its accepts,
// closes and HELLOs through atomic words (`AddressCounts`, `SharedTokenBucket`), so a loop
// preempted in the middle of one holds no other loop up.

/// Decides which new connections and handshakes the server takes on, shared by all loops:
/// a cap on connections per IP address, and a token bucket pacing handshakes so that a
/// reconnect storm cannot starve the devices that are already connected.
final class AdmissionControl: Sendable {
    /// Open connections per address.
    let perAddress: AddressCounts
    /// Paces handshakes; its rate and burst are the configured handshake rate.
    private let bucket: SharedTokenBucket
    /// Both limits may change at run time (`update`, on SIGHUP).
    private let maxPerAddress: Atomic<Int32>

    /// `addressSlots`: the size of the per-address table (`AddressCounts`); nil: sized
    /// from the process's descriptor limit.
    init(maxConnectionsPerAddress: Int, handshakeRate: Int, now: Instant, addressSlots: Int? = nil) {
        maxPerAddress = Atomic(Int32(clamping: maxConnectionsPerAddress))
        bucket = SharedTokenBucket(rate: Double(handshakeRate), burst: Double(handshakeRate), now: now)
        perAddress = AddressCounts(slotCount: addressSlots ?? AddressCounts.slotCount(descriptorLimit: Self.descriptorLimit()))
    }

    /// The soft limit on open descriptors (one per connection).
    private static func descriptorLimit() -> UInt64 {
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return 1024 }
        return UInt64(limit.rlim_cur)
    }

    /// The cap on connections from one address now in force.
    var maxConnectionsPerAddress: Int { Int(maxPerAddress.load(ordering: .relaxed)) }

    /// Puts new limits in force. Connections already open stay, even above a lowered cap;
    /// a new handshake rate starts with a full bucket.
    func update(maxConnectionsPerAddress: Int, handshakeRate: Int, now: Instant) {
        maxPerAddress.store(Int32(clamping: maxConnectionsPerAddress), ordering: .relaxed)
        let rate = Double(handshakeRate)
        guard bucket.currentPace != TokenBucket.Pace(rate: rate, burst: rate) else { return }
        bucket.reset(rate: rate, burst: rate, now: now)
    }

    /// Counts a new connection from `address` (a hash of its IP). `.refused` if over the
    /// cap (nothing counted); `.uncounted` when the table had no room for it
    /// (`AddressCounts`): admitted, and its close must not release it.
    func admitConnection(from address: UInt32) -> AddressCounts.Admission {
        perAddress.admit(address, limit: maxConnectionsPerAddress)
    }

    /// Releases a connection `admitConnection` counted.
    func releaseConnection(from address: UInt32) {
        perAddress.release(address)
    }

    /// Takes a handshake token; false means "tell the client to come back later".
    func admitHandshake(now: Instant) -> Bool {
        bucket.tryTake(now: now)
    }
}
