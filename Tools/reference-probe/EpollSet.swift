#if canImport(Glibc)
import Glibc
#endif

/// A level-triggered epoll set whose entries carry a 64-bit token (a subscriber number).
///
/// Glibc's Swift module does not include <sys/epoll.h>, so the three calls are looked up
/// once in the C library with dlsym and called through C function pointers, and
/// `struct epoll_event` is read and written as raw bytes: packed (12 bytes, data at offset
/// 4) on x86-64, naturally aligned (16 bytes, data at offset 8) elsewhere.
final class EpollSet: @unchecked Sendable {
    static let input: UInt32 = 0x001
    static let output: UInt32 = 0x004
    static let error: UInt32 = 0x008
    static let hangUp: UInt32 = 0x010

    #if arch(x86_64)
    private static let entrySize = 12
    private static let dataOffset = 4
    #else
    private static let entrySize = 16
    private static let dataOffset = 8
    #endif

    let fd: Int32
    private let capacity: Int
    private let entries: UnsafeMutableRawPointer

    init(capacity: Int = 1024) throws(ProbeError) {
        fd = EpollCalls.create(Int32(O_CLOEXEC))
        guard fd >= 0 else { throw ProbeError(call: "epoll_create1") }
        self.capacity = capacity
        entries = .allocate(byteCount: capacity * Self.entrySize, alignment: 8)
    }

    deinit {
        close(fd)
        entries.deallocate()
    }

    /// Registers `descriptor`; false (errno set) on failure.
    func add(_ descriptor: Int32, token: UInt64, events: UInt32) -> Bool {
        control(1, descriptor, token: token, events: events)
    }

    func modify(_ descriptor: Int32, token: UInt64, events: UInt32) -> Bool {
        control(3, descriptor, token: token, events: events)
    }

    /// Waits up to `timeoutMilliseconds` and calls `body(token, events)` for each ready entry.
    func wait(timeoutMilliseconds: Int32, _ body: (UInt64, UInt32) -> Void) {
        let count = EpollCalls.wait(fd, entries, Int32(capacity), timeoutMilliseconds)
        guard count > 0 else { return }
        for index in 0..<Int(count) {
            let entry = entries + index * Self.entrySize
            body(entry.loadUnaligned(fromByteOffset: Self.dataOffset, as: UInt64.self),
                 entry.loadUnaligned(as: UInt32.self))
        }
    }

    private func control(_ operation: Int32, _ descriptor: Int32, token: UInt64, events: UInt32) -> Bool {
        var entry: (UInt64, UInt64) = (0, 0)  // 16 bytes, enough for either layout
        return withUnsafeMutableBytes(of: &entry) { raw in
            raw.storeBytes(of: events, toByteOffset: 0, as: UInt32.self)
            raw.storeBytes(of: token, toByteOffset: Self.dataOffset, as: UInt64.self)
            return EpollCalls.control(fd, operation, descriptor, raw.baseAddress) == 0
        }
    }
}

/// epoll_create1, epoll_ctl and epoll_wait from the C library, with the C calling convention.
private enum EpollCalls {
    typealias Create = @convention(c) (Int32) -> Int32
    typealias Control = @convention(c) (Int32, Int32, Int32, UnsafeMutableRawPointer?) -> Int32
    typealias Wait = @convention(c) (Int32, UnsafeMutableRawPointer?, Int32, Int32) -> Int32

    nonisolated(unsafe) static let create: Create = symbol("epoll_create1")
    nonisolated(unsafe) static let control: Control = symbol("epoll_ctl")
    nonisolated(unsafe) static let wait: Wait = symbol("epoll_wait")

    private static func symbol<Function>(_ name: String) -> Function {
        guard let address = dlsym(dlopen(nil, RTLD_NOW), name) else {
            fatalError("reference-probe: the C library has no \(name)")
        }
        return unsafeBitCast(address, to: Function.self)
    }
}
