import Foundation
import SignalingTLS
import TestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// Both ends of a TLS connection over a non-blocking socket pair, stepped by hand in one
/// thread: each step does what the socket allows and says what it needs next.
private final class Pair {
    let serverFD: Int32, clientFD: Int32
    let server: TLSConnection, client: TLSConnection

    init(server serverContext: TLSServerContext, client clientContext: TLSClientContext, name: String?, offering session: TLSSession? = nil) throws {
        var fds: [Int32] = [-1, -1]
        guard socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0, &fds) == 0 else {
            throw POSIXError(.EMFILE)
        }
        serverFD = fds[0]
        clientFD = fds[1]
        server = TLSConnection.accepting(fd: serverFD, context: serverContext)!
        client = TLSConnection.connecting(fd: clientFD, context: clientContext, serverName: name)!
        if let session { client.offer(session) }
    }

    deinit {
        server.free()
        client.free()
        close(serverFD)
        close(clientFD)
    }

    /// Steps both handshakes until each is done or failed (a socket pair never loses bytes,
    /// so a bounded number of rounds settles it).
    func handshake() -> (server: TLSStatus, client: TLSStatus) {
        var serverStatus = TLSStatus.wantRead, clientStatus = TLSStatus.wantRead
        for _ in 0..<20 {
            if case .wantRead = clientStatus { clientStatus = client.handshake() } else if case .wantWrite = clientStatus { clientStatus = client.handshake() }
            if case .wantRead = serverStatus { serverStatus = server.handshake() } else if case .wantWrite = serverStatus { serverStatus = server.handshake() }
            if !serverStatus.isPending && !clientStatus.isPending { break }
        }
        return (serverStatus, clientStatus)
    }

    /// Reads what `connection` can get now.
    func read(_ connection: TLSConnection) -> [UInt8] {
        var received: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let status = buffer.withUnsafeMutableBytes { connection.read(into: $0) }
            guard case .done(let count) = status else { return received }
            received += buffer[..<count]
        }
    }
}

extension TLSStatus {
    fileprivate var isPending: Bool {
        switch self {
        case .wantRead, .wantWrite: return true
        default: return false
        }
    }
}

@Suite("TLS connections on non-blocking sockets")
struct TLSConnectionTests {
    @Test("a client that trusts the CA completes a TLS 1.3 handshake with ALPN vsig/1 and both sides exchange bytes")
    func handshakeAndExchange() throws {
        let certificates = try TestCertificates()
        let server = try TLSServerContext(certificateChainFile: certificates.serverChainFile, privateKeyFile: certificates.serverKeyFile)
        let client = try TLSClientContext(caFile: certificates.caFile)
        let pair = try Pair(server: server, client: client, name: "localhost")
        let (serverStatus, clientStatus) = pair.handshake()
        #expect(serverStatus == .done(0))
        #expect(clientStatus == .done(0))
        #expect(pair.client.version == .v1_3)
        // OpenSSL's client lists AES-256-GCM first; the server's order wins (the cheaper handshake).
        #expect(pair.client.cipherSuite == "TLS_AES_128_GCM_SHA256")
        #expect(pair.server.cipherSuite == "TLS_AES_128_GCM_SHA256")
        #expect(pair.server.alpn == "vsig/1")
        #expect(pair.client.alpn == "vsig/1")
        let message = Array("HELLO over TLS".utf8)
        #expect(message.withUnsafeBytes { pair.client.write($0) } == .done(message.count))
        #expect(pair.read(pair.server) == message)
        #expect(Array("WELCOME".utf8).withUnsafeBytes { pair.server.write($0) } == .done(7))
        #expect(pair.read(pair.client) == Array("WELCOME".utf8))
    }

    @Test("the certificate is checked against the name or the address the client dialled")
    func serverNameIsChecked() throws {
        let certificates = try TestCertificates()
        let server = try TLSServerContext(certificateChainFile: certificates.serverChainFile, privateKeyFile: certificates.serverKeyFile)
        let client = try TLSClientContext(caFile: certificates.caFile)
        #expect(try Pair(server: server, client: client, name: "127.0.0.1").handshake().client == .done(0))
        let wrongName = try Pair(server: server, client: client, name: "signal.example.com").handshake().client
        guard case .failed(let error) = wrongName else {
            Issue.record("a certificate for localhost was accepted for signal.example.com: \(wrongName)")
            return
        }
        #expect(error.isCertificateRejected)
        #expect(error.message.contains("hostname mismatch"), "\(error)")
    }

    @Test("a client that does not trust the issuer rejects the certificate with a clear reason")
    func untrustedIssuerIsRejected() throws {
        let certificates = try TestCertificates(), stranger = try TestCertificates()
        let server = try TLSServerContext(certificateChainFile: certificates.serverChainFile, privateKeyFile: certificates.serverKeyFile)
        let client = try TLSClientContext(caFile: stranger.caFile)
        let status = try Pair(server: server, client: client, name: "localhost").handshake().client
        guard case .failed(let error) = status else {
            Issue.record("a certificate from an unknown CA was accepted: \(status)")
            return
        }
        #expect(error.isCertificateRejected)
        #expect(error.message.contains("certificate verify failed"), "\(error)")
    }

    @Test("a client that offers only another ALPN protocol is refused; one that offers none is served")
    func alpnIsEnforcedWhenOffered() throws {
        let certificates = try TestCertificates()
        let server = try TLSServerContext(certificateChainFile: certificates.serverChainFile, privateKeyFile: certificates.serverKeyFile)
        let other = try TLSClientContext(caFile: certificates.caFile, alpn: "h2")
        let refused = try Pair(server: server, client: other, name: "localhost").handshake()
        guard case .failed = refused.server else {
            Issue.record("a client offering only h2 was served: \(refused)")
            return
        }
        let none = try TLSClientContext(caFile: certificates.caFile, alpn: nil)
        let served = try Pair(server: server, client: none, name: "localhost")
        #expect(served.handshake().server == .done(0))
        #expect(served.server.alpn == nil)
    }

    @Test("a ticket from one server context resumes on another that shares the ticket key, as after a reload or a restart")
    func ticketsResumeAcrossContextsSharingTheKey() throws {
        let certificates = try TestCertificates()
        let key = (0..<TLSServerContext.ticketKeyLength).map { UInt8(truncatingIfNeeded: $0 &* 7) }
        let first = try TLSServerContext(
            certificateChainFile: certificates.serverChainFile, privateKeyFile: certificates.serverKeyFile, ticketKey: key)
        let client = try TLSClientContext(caFile: certificates.caFile)
        let initial = try Pair(server: first, client: client, name: "localhost")
        #expect(initial.handshake().client == .done(0))
        #expect(!initial.client.resumedSession)
        // In TLS 1.3 the ticket follows the handshake: it arrives with the first read.
        #expect(Array("x".utf8).withUnsafeBytes { initial.server.write($0) } == .done(1))
        _ = initial.read(initial.client)
        let session = try #require(initial.client.resumableSession())

        let reloaded = try TLSServerContext(
            certificateChainFile: certificates.serverChainFile, privateKeyFile: certificates.serverKeyFile, ticketKey: key)
        let resumed = try Pair(server: reloaded, client: client, name: "localhost", offering: session)
        #expect(resumed.handshake().client == .done(0))
        #expect(resumed.server.resumedSession)

        let stranger = try TLSServerContext(certificateChainFile: certificates.serverChainFile, privateKeyFile: certificates.serverKeyFile)
        let full = try Pair(server: stranger, client: client, name: "localhost", offering: session)
        #expect(full.handshake().client == .done(0))
        #expect(!full.server.resumedSession)
    }

    @Test("the public-key hash a client pins is the one openssl computes from the certificate")
    func pinMatchesOpenSSL() throws {
        let certificates = try TestCertificates()
        let server = try TLSServerContext(certificateChainFile: certificates.serverChainFile, privateKeyFile: certificates.serverKeyFile)
        let pair = try Pair(server: server, client: try TLSClientContext(caFile: certificates.caFile), name: "localhost")
        #expect(pair.handshake().client == .done(0))
        let hash = try #require(pair.client.peerPublicKeySHA256)
        #expect(hash.map { String(format: "%02x", $0) }.joined() == (try certificates.publicKeySHA256(ofCertificate: certificates.serverChainFile)))
    }

    @Test("a missing file, a key that does not match and a bad ticket key are refused with the file named")
    func badConfigurationIsRefused() throws {
        let certificates = try TestCertificates()
        let other = try certificates.makeServer(named: "localhost", file: "other")
        #expect(throws: TLSError.self) {
            try TLSServerContext(certificateChainFile: certificates.directory.file("absent.pem"), privateKeyFile: certificates.serverKeyFile)
        }
        do {
            _ = try TLSServerContext(certificateChainFile: certificates.serverChainFile, privateKeyFile: other.key)
            Issue.record("a key that does not match the certificate was accepted")
        } catch {
            #expect(error.message.contains("does not match"), "\(error)")
            #expect(error.message.contains(other.key), "\(error)")
        }
        #expect(throws: TLSError.self) {
            try TLSServerContext(
                certificateChainFile: certificates.serverChainFile, privateKeyFile: certificates.serverKeyFile, ticketKey: [1, 2, 3])
        }
        #expect(throws: TLSError.self) { try TLSClientContext(caFile: certificates.directory.file("absent-ca.pem")) }
    }

    @Test("a peer that closes the socket without close_notify reads as closed, not as an error")
    func abruptCloseIsAClose() throws {
        let certificates = try TestCertificates()
        let server = try TLSServerContext(certificateChainFile: certificates.serverChainFile, privateKeyFile: certificates.serverKeyFile)
        let pair = try Pair(server: server, client: try TLSClientContext(caFile: certificates.caFile), name: "localhost")
        #expect(pair.handshake().server == .done(0))
        shutdown(pair.clientFD, Int32(SHUT_WR))
        var buffer = [UInt8](repeating: 0, count: 64)
        #expect(buffer.withUnsafeMutableBytes { pair.server.read(into: $0) } == .closed)
    }
}
