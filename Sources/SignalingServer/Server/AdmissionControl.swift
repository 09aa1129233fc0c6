import SignalingSupport
import Synchronization

/// Decides which new connections and handshakes the server takes on, shared by all loops:
/// a cap on connections per IP address, and a token bucket pacing handshakes so that a
/// reconnect storm cannot starve the devices that are already connected.
final class AdmissionControl: Sendable {
    private let perAddress = Mutex<[UInt32: Int32]>([:])
    private let bucket: Mutex<TokenBucket>
    private let maxPerAddress: Int32

    init(maxConnectionsPerAddress: Int, handshakeRate: Int, now: Instant) {
        maxPerAddress = Int32(clamping: maxConnectionsPerAddress)
        bucket = Mutex(TokenBucket(rate: Double(handshakeRate), burst: Double(handshakeRate), now: now))
    }

    /// Counts a new connection from `address` (a hash of its IP); false if over the cap,
    /// in which case nothing was counted.
    func admitConnection(from address: UInt32) -> Bool {
        perAddress.withLock { counts in
            let current = counts[address, default: 0]
            guard current < maxPerAddress else { return false }
            counts[address] = current + 1
            return true
        }
    }

    func releaseConnection(from address: UInt32) {
        perAddress.withLock { counts in
            guard let current = counts[address] else { return }
            counts[address] = current > 1 ? current - 1 : nil
        }
    }

    /// Takes a handshake token; false means "tell the client to come back later".
    func admitHandshake(now: Instant) -> Bool {
        bucket.withLock { $0.tryTake(now: now) }
    }
}
