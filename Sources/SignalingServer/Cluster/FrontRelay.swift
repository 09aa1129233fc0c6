import SignalingProtocol
import SignalingStore
import SignalingSupport
import Synchronization

// Locks of this file (docs/ARCHITECTURE.md, "Locks"): `route` (timed, `front_route`) is a leaf taken by a front
// loop at the end of a callback (to send its batch) and when it opens a device, by the
// link's thread (an event) and by the lease thread (the home it polled). `link.send` is
// called under it, so that the `.reset` for a home is queued on the link before any loop
// can address that home (the link keeps one sender's packets in order, whichever thread
// sends them); so is `link.checkListener`. Nothing else is taken under it; both return at
// once (NodeLink's contract).

/// The front side of the relay (docs/CLUSTER.md, "Fronts"): which node the devices a front
/// accepts are relayed to (the *home*, the store lease's holder), whether that can be done
/// now, and the packets from the home, handed to the loops that own their connections.
///
/// A front's loops keep their relayed connections under a *route epoch*: every time the
/// route breaks (the link went down, the lease holder changed, a packet for the home came
/// back undeliverable) the epoch moves on, and each loop closes every connection relayed
/// under an older epoch with CLOSE goingAway, as in a drain: bytes may have been lost
/// either way, so the device reconnects and resumes its session on the home. The first
/// packet to a home under a new epoch is `.reset` (its connections from this front are
/// forgotten), queued before any loop can send an `.open`.
///
/// A home is addressed only once the front has heard that it listens (`homeListens`): a
/// node that has just taken the lease subscribes to its owner id only once its server runs
/// (after the store's snapshot is loaded), and a packet published before that would come
/// back undeliverable and close every device opened meanwhile. So after each break of the
/// route (a new holder, an undeliverable packet, the link down and up) the front asks
/// the link whether the home listens (`NodeLink.checkListener`: on Redis one `PUBSUB
/// NUMSUB`, asked at every poll of the lease holder and at the link's `.up`) and until
/// the answer comes its loops hold new devices (`Admission.wait`): their bytes wait
/// unrelayed, within their handshake deadline, and are announced when the answer comes.
///
/// One per node, for the node's life: the link's state (up or down) outlives a front term.
public final class FrontRelay: Sendable {
    private struct Route {
        /// The lease holder's owner id: where relayed bytes go (nil: no home, the lease is free).
        var home: String?
        var linkUp = false
        /// The link said that `home` listens (`.listening`) since the route last broke:
        /// false means no loop has opened a connection under `epoch` yet.
        var homeListens = false
        var epoch: UInt64 = 1
        /// `.reset` is owed to `home` before anything else is sent to it under this epoch.
        var owesReset = true
        /// The loops of the running front term (empty between terms).
        var loops: [EventLoop] = []
    }

    public let link: any NodeLink
    private let route = Mutex(Route())

    public init(link: any NodeLink) {
        self.link = link
    }

    /// Where new devices can go, or why they cannot (nil: they can): `/readyz` of a front.
    public var unavailableReason: String? {
        route.withLock(timing: .frontRoute) { route in
            if !route.linkUp { return "the link to the other nodes is down" }
            guard let home = route.home else { return "no routing node: the store lease is free" }
            if !route.homeListens { return "the routing node \(home) does not listen on the link yet" }
            return nil
        }
    }

    /// The current home (the lease holder), for logs and tests.
    public var home: String? { route.withLock(timing: .frontRoute) { $0.home } }

    /// The lease holder the node polled (`StoreLease.holder()`), at every poll. A change
    /// breaks the route: relayed devices are closed and the new home gets `.reset` first.
    /// While the home is not known to listen, the link is asked again (one question per
    /// poll).
    public func setHome(_ holder: String?) {
        let loops = route.withLock(timing: .frontRoute) { route -> [EventLoop] in
            var affected: [EventLoop] = []
            if route.home != holder {
                route.home = holder
                affected = Self.breakRoute(&route)
            }
            Self.askWhetherHomeListens(route, link: link)
            return affected
        }
        for loop in loops { loop.post(.relayRouteChanged) }
    }

    /// What the node's link said (on the link's thread; never blocks).
    public func receive(_ event: NodeLinkEvent) {
        var affected: [EventLoop] = []
        switch event {
        case .packet(let bytes):
            return deliver(bytes)
        case .up:
            route.withLock(timing: .frontRoute) { route in
                route.linkUp = true
                Self.askWhetherHomeListens(route, link: link)
            }
        case .listening(let node):
            // The loops open the devices they hold (`relayRouteChanged`).
            affected = route.withLock(timing: .frontRoute) { route in
                guard route.home == node, route.linkUp, !route.homeListens else { return [] }
                route.homeListens = true
                return route.loops
            }
        case .down:
            affected = route.withLock(timing: .frontRoute) { route in
                route.linkUp = false
                return Self.breakRoute(&route)
            }
        case .undeliverable(let node):
            affected = route.withLock(timing: .frontRoute) { route in route.home == node ? Self.breakRoute(&route) : [] }
        case .gone:
            return
        }
        for loop in affected { loop.post(.relayRouteChanged) }
    }

    /// Moves to a new epoch, whose home is not known to listen: returns the loops to tell.
    private static func breakRoute(_ route: inout Route) -> [EventLoop] {
        route.epoch += 1
        route.owesReset = true
        route.homeListens = false
        return route.loops
    }

    /// Asks the link whether the home listens, unless it is known to, or cannot be asked
    /// (no home, the link down). Under `route`: the answer is checked against the home
    /// it was asked about.
    private static func askWhetherHomeListens(_ route: Route, link: any NodeLink) {
        guard let home = route.home, route.linkUp, !route.homeListens else { return }
        link.checkListener(home)
    }

    /// The loops of a new front term: they relay from now on, under a new epoch (the home
    /// may hold connections of an earlier term of this node).
    func attach(_ loops: [EventLoop]) {
        route.withLock(timing: .frontRoute) { route in
            // The home is the same, and so is whether it listens.
            let listens = route.homeListens
            _ = Self.breakRoute(&route)
            route.homeListens = listens
            route.loops = loops
        }
    }

    func detach() {
        route.withLock(timing: .frontRoute) { $0.loops = [] }
    }

    /// What a loop does with a device whose PROXY header and TLS handshake are done.
    enum Admission: Equatable {
        /// Announce it to the home under this epoch.
        case relay(epoch: UInt64)
        /// Hold it: the home is not known to listen yet (its bytes wait until it is, or
        /// until the device's handshake deadline).
        case wait
        /// No route (the link down, or no home): CLOSE goingAway.
        case refuse
    }

    /// Whether devices can be relayed now (a loop about to open one).
    func admission() -> Admission {
        route.withLock(timing: .frontRoute) { route in
            guard route.linkUp, route.home != nil else { return .refuse }
            return route.homeListens ? .relay(epoch: route.epoch) : .wait
        }
    }

    /// The epoch now, whatever the route's state (a loop checking its connections).
    var epoch: UInt64 { route.withLock(timing: .frontRoute) { $0.epoch } }

    /// Sends one loop's batch to the home, if it was made under the current epoch (else the
    /// loop is about to close those connections, and the frames are dropped). Returns
    /// false when dropped.
    @discardableResult
    func send(_ frames: [RelayPacket.Frame], epoch: UInt64) -> Bool {
        route.withLock(timing: .frontRoute) { route in
            guard route.epoch == epoch, route.linkUp, route.homeListens, let home = route.home else { return false }
            let packet: RelayPacket
            if route.owesReset {
                route.owesReset = false
                packet = RelayPacket(from: link.nodeID, frames: [.reset] + frames)
            } else {
                packet = RelayPacket(from: link.nodeID, frames: frames)
            }
            link.send(packet.encoded(), to: home)
            return true
        }
    }

    /// Hands a packet from the home to the loops whose connections it names, one task per
    /// loop. A packet that does not decode is dropped: it came from a node of another
    /// version (RelayPacket).
    private func deliver(_ bytes: [UInt8]) {
        let packet: RelayPacket
        do {
            packet = try RelayPacket(decoding: bytes)
        } catch {
            return
        }
        let loops = route.withLock(timing: .frontRoute) { $0.loops }
        guard !loops.isEmpty else { return }
        var byLoop: [Int: [RelayPacket.Frame]] = [:]
        for frame in packet.frames {
            guard let ref = ConnectionRef(packed: frame.connection), Int(ref.loop) < loops.count else { continue }
            byLoop[Int(ref.loop), default: []].append(frame)
        }
        for (index, frames) in byLoop { loops[index].post(.relayed(frames)) }
    }
}
