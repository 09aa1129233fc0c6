@testable import SignalingServer
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// A loop's wake-up descriptor lives as long as the loop object: anyone holding a loop may
/// post to it after it has drained, and a descriptor closed under them would be the next
/// socket the process opens.
@Suite("Event loop lifetime", .serialized)
struct LoopLifetimeTests {
    /// What descriptor `fd` is, from /proc ("anon_inode:[eventfd]", "socket:[...]"), or nil
    /// when it is not open.
    func kind(of fd: Int32) -> String? {
        var buffer = [CChar](repeating: 0, count: 256)
        let count = readlink("/proc/self/fd/\(fd)", &buffer, buffer.count - 1)
        guard count > 0 else { return nil }
        return String(decoding: buffer[0..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    @Test("a post to a loop that has drained wakes nobody else: its eventfd stays open until the loop is gone, so no socket opened after the stop gets the wake-up's bytes")
    func postAfterTheLoopDrained() throws {
        var loops: [EventLoop] = []
        do {
            let server = try TestServer(workers: 2)
            loops = server.server.eventLoops
        }  // stopped and drained: every loop's `run` has returned
        #expect(loops.count == 2)
        // Sockets opened now take the lowest free numbers, as a closed eventfd's would be.
        var pairs: [[Int32]] = []
        defer { for pair in pairs { close(pair[0]); close(pair[1]) } }
        for _ in 0..<4 {
            var fds: [Int32] = [-1, -1]
            #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &fds) == 0)
            pairs.append(fds)
        }
        for loop in loops {
            let drained = loop.finished.load(ordering: .acquiring)
            #expect(drained)
            #expect(kind(of: loop.wakeFD) == "anon_inode:[eventfd]", "the drained loop's wake-up descriptor was closed (or reused)")
            loop.post(.wake(ConnectionRef(loop: loop.index, slot: 0, generation: 1)))
        }
        for pair in pairs {
            var byte: UInt8 = 0
            #expect(recv(pair[1], &byte, 1, Int32(MSG_DONTWAIT)) == -1, "a socket opened after the stop received a loop's wake-up")
        }
    }
}
