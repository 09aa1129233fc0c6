import Dispatch
import SignalingStore
import Synchronization

/// Nodes of one test process linked in memory, the way `RedisNodeLink` links nodes through
/// Redis pub/sub: the same `NodeLink` contract (docs/CLUSTER.md), with the failures a test
/// needs on demand (`cut`, `restore`, `expire`).
///
/// Each link delivers its events on a serial queue of its own (the link's "thread"), in
/// order: packets from one sender to one destination arrive in the order sent.
public final class LocalNodeBus: Sendable {
    private struct State {
        /// Every name a started link listens as (its id and its `listen(as:)` names).
        var listeners: [String: LocalNodeLink] = [:]
        /// Nodes whose presence a test expired (`expire`).
        var expired: Set<String> = []
        /// Nodes cut off (`cut`): they neither send nor receive until `restore`.
        var cut: Set<String> = []
        var nextID = 1
    }

    private let state = Mutex(State())

    public init() {}

    /// A new node on this bus, with a unique id.
    public func makeLink(named prefix: String = "node") -> LocalNodeLink {
        let id = state.withLock { state in
            defer { state.nextID += 1 }
            return "\(prefix)-\(state.nextID)"
        }
        return LocalNodeLink(bus: self, nodeID: id)
    }

    /// Cuts `node` off: it gets `.down` and from now on neither sends nor receives, as a
    /// node whose Redis connection dropped (packets in flight are lost).
    public func cut(_ node: LocalNodeLink) {
        state.withLock { _ = $0.cut.insert(node.nodeID) }
        node.deliver(.down(reason: "cut off by the test"))
    }

    /// Ends a `cut`: the node gets `.up` again.
    public func restore(_ node: LocalNodeLink) {
        state.withLock { _ = $0.cut.remove(node.nodeID) }
        node.deliver(.up)
    }

    /// `node`'s presence key expires, as after a kill -9 (its later `checkPresence` answers
    /// name it `gone`).
    public func expire(_ node: String) {
        state.withLock { _ = $0.expired.insert(node) }
    }

    func register(_ link: LocalNodeLink, as name: String) {
        state.withLock { $0.listeners[name] = link }
    }

    func unregister(_ link: LocalNodeLink, as name: String) {
        state.withLock { state in
            if state.listeners[name] === link { state.listeners[name] = nil }
        }
    }

    func route(_ packet: [UInt8], from sender: LocalNodeLink, to name: String) {
        let target: LocalNodeLink?? = state.withLock { state in
            if state.cut.contains(sender.nodeID) { return .some(nil) }  // lost on the way out
            guard let target = state.listeners[name], !state.cut.contains(target.nodeID) else { return nil }
            return .some(target)
        }
        switch target {
        case .some(.some(let target)): target.deliver(.packet(packet))
        case .some(.none): break
        case .none: sender.deliver(.undeliverable(node: name))
        }
    }

    /// Whether `asker` (not cut off) can see a listener of `name` (not cut off either).
    func isListened(_ name: String, by asker: LocalNodeLink) -> Bool {
        state.withLock { state in
            guard !state.cut.contains(asker.nodeID), let listener = state.listeners[name] else { return false }
            return !state.cut.contains(listener.nodeID)
        }
    }

    func isPresent(_ node: String) -> Bool {
        state.withLock { state in !state.expired.contains(node) }
    }
}

/// One node's link on a `LocalNodeBus`.
public final class LocalNodeLink: NodeLink, Sendable {
    public let nodeID: String
    private let bus: LocalNodeBus
    private let queue: DispatchQueue
    private let names = Mutex<Set<String>>([])
    private let handler = Mutex<(@Sendable (NodeLinkEvent) -> Void)?>(nil)

    init(bus: LocalNodeBus, nodeID: String) {
        self.bus = bus
        self.nodeID = nodeID
        queue = DispatchQueue(label: "link.\(nodeID)")
    }

    public func start(_ handler: @escaping @Sendable (NodeLinkEvent) -> Void) {
        self.handler.withLock { $0 = handler }
        listen(as: nodeID)
        deliver(.up)
    }

    public func listen(as name: String) {
        names.withLock { _ = $0.insert(name) }
        bus.register(self, as: name)
    }

    public func stopListening(as name: String) {
        names.withLock { _ = $0.remove(name) }
        bus.unregister(self, as: name)
    }

    public func send(_ packet: [UInt8], to node: String) {
        bus.route(packet, from: self, to: node)
    }

    public func checkListener(_ name: String) {
        if bus.isListened(name, by: self) { deliver(.listening(node: name)) }
    }

    public func checkPresence(of nodes: [String]) {
        for node in nodes where !bus.isPresent(node) { deliver(.gone(node: node)) }
    }

    public func stop() {
        for name in names.withLock({ $0 }) { stopListening(as: name) }
        handler.withLock { $0 = nil }
        queue.sync {}
    }

    func deliver(_ event: NodeLinkEvent) {
        queue.async { self.handler.withLock { $0 }?(event) }
    }
}
