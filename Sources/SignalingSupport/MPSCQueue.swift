import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// A lock-free multi-producer single-consumer queue that can be closed: any thread pushes
/// (one element or a batch), one consumer takes everything queued at once, in the order it
/// was pushed (per producer FIFO; batches stay contiguous), and may close the queue, after
/// which every push is refused and its poster keeps the work. Nobody ever waits for
/// another thread: there is no lock, hence no hold a preempted thread could stretch.
///
/// How: the queue is one atomic `head` pointer to a singly linked list of nodes, newest
/// first (a Treiber stack whose only pop is "take the whole list"). A producer links its
/// node (or a batch pre-linked into a chain) in front of the head it read and publishes it
/// with a compare-and-exchange, retrying if another push came first. The consumer swaps
/// the head for nil (`exchange`) and reverses what it took, which restores posting order.
/// Closing swaps in `closedAddress` (1), an address no node has (nodes are aligned); a
/// producer that reads it refuses.
///
/// Memory ordering: a producer writes its nodes (element, `next`) and then publishes them
/// with a *releasing* compare-and-exchange; the consumer's *acquiring* exchange reads the
/// head. Every push is a read-modify-write of `head`, so a later push continues the
/// release sequence of each earlier one: the consumer's acquire synchronises with every
/// producer whose nodes it took, and sees their `next` links and elements fully written. Producers never read a node they did not allocate, so their
/// loads of `head` need no ordering beyond the check for `closedAddress` (acquiring: a
/// refused poster has synchronised with the close, as under a lock).
///
/// No ABA: the consumer never pops one node (the classic ABA needs "head is A, so A.next
/// is still the next node"); it exchanges the whole list. A producer's compare-and-exchange
/// asserts only "the head is still the pointer my last node links to", which is exactly
/// what its link needs, even if that address was taken, freed and reused meanwhile: the
/// node now at that address is the current head, and linking to it is correct.
///
/// Cost: one allocation per element pushed (its node) and one atomic read-modify-write per
/// push (per batch, not per element), plus retries under contention; a take is one load
/// when empty, else one exchange and a walk over the elements. Memory: one node per queued
/// element (the element and a pointer).
///
/// Visible to ThreadSanitizer: every synchronisation is an atomic operation.
///
/// Inlinable, so that the modules that use it get it specialised for their element: a
/// generic call across modules looked up the element's metadata at run time on every
/// push and take (about 1.5 % of a loop's samples with the store writer's queues).
/// The deinit cannot be specialised (it runs generic, in this module): the head is an
/// `Atomic<UInt>` holding the node's address, and the closed mark a constant address, so
/// that ending an empty queue needs no metadata. With `Atomic<UnsafeMutablePointer<Node>?>`
/// every deinit looked up the metadata of `Atomic`, `Optional`, `UnsafeMutablePointer` and
/// `Node` for its element at run time, about 1,400 instructions: once per message with a
/// store, whose `DeferredReply` holds a queue (docs/LOAD-TESTING.md, "The loop's
/// instructions per message").
public struct MPSCQueue<Element>: ~Copyable {
    @usableFromInline
    struct Node {
        @usableFromInline var element: Element
        @usableFromInline var next: UnsafeMutablePointer<Node>?

        @usableFromInline
        init(element: Element, next: UnsafeMutablePointer<Node>?) {
            self.element = element
            self.next = next
        }
    }

    /// The address of the newest node (0: empty; `closedAddress`: closed).
    @usableFromInline let head = Atomic<UInt>(0)

    @inlinable
    public init() {}

    deinit {
        let list = head.load(ordering: .acquiring)
        // Only a queue ended with elements in it (a server stopping) walks its nodes,
        // which needs the element's metadata.
        if list != 0 && list != Self.closedAddress { Self.free(Self.node(at: list)) }
    }

    @inlinable
    static func node(at address: UInt) -> UnsafeMutablePointer<Node>? { UnsafeMutablePointer(bitPattern: address) }

    @inlinable
    static func address(of node: UnsafeMutablePointer<Node>?) -> UInt { UInt(bitPattern: node) }

    /// A node's memory, straight from `malloc` (and back with `free`, `deallocateNode`):
    /// `UnsafeMutablePointer.allocate` takes the runtime's aligned path for every type
    /// (`swift_slowAlloc` → `posix_memalign`, about 45 instructions more a node, four
    /// nodes a message with a store: callgrind, issue 16), and a node needs no more than
    /// malloc's alignment. A node of a more aligned element keeps the standard path (a
    /// static choice, so each node is freed the way it was allocated).
    @inlinable
    static func allocateNode() -> UnsafeMutablePointer<Node> {
        guard MemoryLayout<Node>.alignment <= 16 else { return .allocate(capacity: 1) }
        guard let memory = malloc(MemoryLayout<Node>.stride) else { fatalError("out of memory for a queue node") }
        return memory.bindMemory(to: Node.self, capacity: 1)
    }

    /// Frees a node's memory (its element deinitialized or moved out already).
    @inlinable
    static func deallocateNode(_ node: UnsafeMutablePointer<Node>) {
        guard MemoryLayout<Node>.alignment <= 16 else { return node.deallocate() }
        Glibc.free(node)  // not `Self.free`, which frees a list
    }

    /// The head of a closed queue: an address no node can have (a node is aligned to its
    /// `next` pointer). A constant, where it was a one-byte allocation per queue (a
    /// malloc and a free per message, whose `DeferredReply` holds a queue: callgrind,
    /// issue 16).
    @inlinable
    static var closedAddress: UInt { 1 }

    /// What a push did.
    public enum PushResult: Equatable, Sendable {
        /// Queued into an empty queue: this poster wakes the consumer (one wake-up per batch
        /// the consumer takes; later posters find the queue non-empty).
        case queuedFirst
        /// Queued behind elements the consumer has not taken yet: it is already woken.
        case queued
        /// The queue is closed: nothing was queued, the poster keeps the work.
        case refused
    }

    /// Pushes `element` (any thread).
    @inlinable @discardableResult
    public func push(_ element: consuming Element) -> PushResult {
        // Its own node, not `push(contentsOf: CollectionOfOne(element))`: iterating the
        // collection copied the element once more (a retain and release of each of its
        // fields, for the store writer's commit units).
        let node = Self.allocateNode()
        node.initialize(to: Node(element: element, next: nil))
        return link(newest: node, oldest: node)
    }

    /// Pushes `elements` as one contiguous batch, in their order (any thread). An empty
    /// batch queues nothing and reports `.queued` (or `.refused` once closed).
    @inlinable @discardableResult
    public func push(contentsOf elements: some Collection<Element>) -> PushResult {
        // The chain is built newest first, before touching the head: the consumer reverses.
        var newest: UnsafeMutablePointer<Node>?
        var oldest: UnsafeMutablePointer<Node>?
        for element in elements {
            let node = Self.allocateNode()
            node.initialize(to: Node(element: element, next: newest))
            if oldest == nil { oldest = node }
            newest = node
        }
        guard let newest, let oldest else { return isClosed ? .refused : .queued }
        return link(newest: newest, oldest: oldest)
    }

    /// Publishes a chain of this push's nodes, `newest` first, linked down to `oldest`.
    @inlinable
    func link(newest: UnsafeMutablePointer<Node>, oldest: UnsafeMutablePointer<Node>) -> PushResult {
        var current = head.load(ordering: .acquiring)
        while true {
            guard current != Self.closedAddress else {
                // A failed attempt may have linked the chain to a head since taken: cut
                // it, so that only this push's nodes are freed.
                oldest.pointee.next = nil
                Self.free(newest)
                return .refused
            }
            oldest.pointee.next = Self.node(at: current)
            let (exchanged, found) = head.compareExchange(
                expected: current, desired: Self.address(of: newest), successOrdering: .releasing, failureOrdering: .acquiring)
            if exchanged { return current == 0 ? .queuedFirst : .queued }
            current = found
        }
    }

    /// Nothing is queued (or the queue is closed). Any thread, as a hint: a push may land
    /// right after.
    @inlinable
    public var isEmpty: Bool {
        let current = head.load(ordering: .acquiring)
        return current == 0 || current == Self.closedAddress
    }

    /// The queue was closed.
    @inlinable
    public var isClosed: Bool { head.load(ordering: .acquiring) == Self.closedAddress }

    /// Consumer only: appends everything queued to `elements`, oldest first, and empties
    /// the queue. Returns whether it took anything (nothing once closed).
    @inlinable @discardableResult
    public func takeAll(appendingTo elements: inout [Element]) -> Bool {
        // One load when empty: the common case of a consumer checking for replies.
        let current = head.load(ordering: .relaxed)
        guard current != 0, current != Self.closedAddress else { return false }
        // Only the consumer replaces a non-nil head or closes, so the head is still a list.
        return Self.drain(Self.node(at: head.exchange(0, ordering: .acquiring)), appendingTo: &elements)
    }

    /// Consumer only: closes the queue (pushes are refused from now on) and appends what
    /// was still queued to `elements`, oldest first. Closing twice takes nothing the second
    /// time. Returns whether it took anything.
    @inlinable @discardableResult
    public func close(appendingTo elements: inout [Element]) -> Bool {
        let taken = head.exchange(Self.closedAddress, ordering: .acquiringAndReleasing)
        guard taken != Self.closedAddress else { return false }
        return Self.drain(Self.node(at: taken), appendingTo: &elements)
    }

    /// Moves the elements of a taken list (newest first) to `elements` in posting order,
    /// freeing its nodes.
    @usableFromInline
    static func drain(_ list: UnsafeMutablePointer<Node>?, appendingTo elements: inout [Element]) -> Bool {
        guard list != nil else { return false }
        // Reverse the links first, then move each element out once: reversing the
        // appended elements instead swapped them through the generic `swapAt` of a slice,
        // which copied and destroyed every element (for the store writer's commit units,
        // a retain and a release of each of their fields).
        var oldest: UnsafeMutablePointer<Node>?
        var node = list
        while let current = node {
            node = current.pointee.next
            current.pointee.next = oldest
            oldest = current
        }
        node = oldest
        while let current = node {
            node = current.pointee.next
            elements.append(current.move().element)
            deallocateNode(current)
        }
        return true
    }

    @usableFromInline
    static func free(_ list: UnsafeMutablePointer<Node>?) {
        var node = list
        while let current = node {
            node = current.pointee.next
            current.deinitialize(count: 1)
            deallocateNode(current)
        }
    }
}

extension MPSCQueue: @unchecked Sendable where Element: Sendable {}
