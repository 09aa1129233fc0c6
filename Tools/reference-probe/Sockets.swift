import SignalingSupport
import VoipLoadKit
#if canImport(Glibc)
import Glibc
#endif

/// The probe's socket steps, on the shared socket layer (`SocketCalls`). Addresses are
/// IPv4 in host byte order; the probe only talks to loopback (127.0.0.0/8).
enum Sockets {
    /// Parses "A.B.C.D:PORT" with A = 127 and a port other than 0.
    static func parseLoopbackEndpoint(_ text: String) -> (address: UInt32, port: UInt16)? {
        guard let endpoint = SocketCalls.parseEndpoint(text), endpoint.address >> 24 == 127, endpoint.port != 0 else {
            return nil
        }
        return endpoint
    }

    /// A TCP socket with TCP_NODELAY (every connection of the probe, for both protocols),
    /// bound to `source` if given, with the port left to connect(2) so that each source
    /// address can use every ephemeral port towards the server.
    static func openTCP(nonBlocking: Bool, source: UInt32?) throws(ProbeError) -> Int32 {
        do throws(SystemError) {
            let fd = try SocketCalls.openTCP(nonBlocking: nonBlocking)
            do throws(SystemError) {
                try? SocketCalls.setOption(fd, level: Int32(IPPROTO_TCP), name: TCP_NODELAY, Int32(1))
                if let source {
                    try? SocketCalls.setOption(fd, level: Int32(IPPROTO_IP), name: IP_BIND_ADDRESS_NO_PORT, Int32(1))
                    try SocketCalls.bind(fd, SocketCalls.socketAddress(source, port: 0))
                }
                return fd
            } catch {
                close(fd)
                throw error
            }
        } catch {
            throw ProbeError(call: error.call, code: error.code)
        }
    }

    /// Starts (non-blocking socket) or performs (blocking socket) a connect. 0 when done or
    /// in progress, otherwise errno.
    static func connect(_ fd: Int32, to destination: sockaddr_in) -> Int32 {
        do throws(SystemError) {
            _ = try SocketCalls.connect(fd, destination)
            return 0
        } catch {
            return error.code
        }
    }

    /// Writes all of `bytes`. On a non-blocking socket a full send buffer counts as failure
    /// (the probe only writes small frames to sockets that are otherwise idle).
    static func sendAll(_ fd: Int32, _ bytes: UnsafeRawBufferPointer) -> Bool {
        (try? SocketCalls.sendAll(fd, bytes)) != nil
    }

    static func sendAll(_ fd: Int32, _ bytes: [UInt8]) -> Bool {
        bytes.withUnsafeBytes { sendAll(fd, $0) }
    }
}
